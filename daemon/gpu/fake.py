"""A fake NVML: the `pynvml` functions the daemon calls, with pynvml's names, return shapes and errors.

Chosen only by `--gpu-backend fake`. Driven by a fixture (default: `fixtures/h100-sxm5-8.json`, an HGX
H100 board: 8× "NVIDIA H100 80GB HBM3", 18 NVLink4 links each; GPU 3 has link 7 down and raises XID 79).
Constants, structs and `NVMLError` are pynvml's own, so field ids and error codes match a real driver.

Values are derived from the (injectable) monotonic clock: counters (energy, NVLink and PCIe bytes,
NVLink errors) integrate a rate and move between scrapes; a GPU is busy while a live process of a job
can see it (see `fake_procs`), which raises utilization, power, clocks and traffic. A fixture's
top-level `kernel_log` names a file the fake writes each XID to as the driver writes it to the
kernel log (`/dev/kmsg`'s format); the backend then reads the kernel's lines there for incidents.

Test hooks (the fake's own API, not pynvml's): `fail_gpu()` makes a GPU answer like one that fell off
the bus, `fail_function()` makes one function fail, `inject_xid()` queues an XID event; `calls` counts
every NVML call by function name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pynvml

from spx.daemon.gpu.fake_api import DeviceEvents, DeviceHealth, DeviceIdentity, DeviceReadings

DEFAULT_FIXTURE = Path(__file__).parent / "fixtures" / "h100-sxm5-8.json"


class FakeNvml(DeviceIdentity, DeviceReadings, DeviceHealth, DeviceEvents):
    """Module-like stand-in for `pynvml` (see module docstring): its functions by subject (fake_api),
    over one state with the test hooks (fake_state)."""

    NVMLError = pynvml.NVMLError

    @classmethod
    def from_fixture(cls, path: Path | str = DEFAULT_FIXTURE, **kwargs: Any) -> FakeNvml:
        path = Path(path)
        return cls(json.loads(path.read_text()), source=path.name, **kwargs)
