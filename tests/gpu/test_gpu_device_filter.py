"""On a real NVIDIA host, as root: the attempt cgroup's device program (run/device_filter.py) lets a
process open its GPU's /dev/nvidiaN and refuses it to a cgroup allowed none, with the driver loaded.

    bash tests/run.sh tests/gpu/test_gpu_device_filter.py -rs

Self-contained and quick: a scratch cgroup under this process's own cgroup v2 (tests/scratch_cgroup.py),
two children with a filter each, one short python process in each. It skips, saying exactly why,
where that cannot be done: not root, no cgroup v2 or none writable, no /dev/nvidiaN node, or the
kernel refusing the program for lack of privilege (EPERM). Any other refusal (a verifier that
rejects the program on this kernel) fails: that is a bug of the program, not of the host.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scratch_cgroup import scratch_cgroup

from spx.daemon.run import device_filter

OPEN = ("import errno, json, os, sys\n"
        "out = {}\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        os.close(os.open(path, os.O_RDWR)); out[path] = 'opened'\n"
        "    except OSError as e:\n"
        "        out[path] = errno.errorcode.get(e.errno, str(e.errno))\n"
        "print(json.dumps(out))\n")


def open_in(cgroup: Path, paths: list[str]) -> dict[str, str]:
    """Each path's open result, from a process started in `cgroup`."""
    r = subprocess.run(["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup),
                        sys.executable, "-c", OPEN, *paths], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_cgroup_opens_its_gpus_node_and_one_allowed_none_gets_eperm(nvml_backend):
    if os.geteuid() != 0:
        pytest.skip("needs root: attaching a cgroup device program takes CAP_BPF and CAP_SYS_ADMIN")
    devices = nvml_backend.devices()
    gpu0 = devices[0]
    assert gpu0.minor is not None, "NVML gives GPU 0 no minor number (nvmlDeviceGetMinorNumber failed)"
    node = f"/dev/nvidia{gpu0.minor}"
    if not Path(node).exists():
        pytest.skip(f"{node} does not exist: the driver's device nodes are not created (nvidia-modprobe -c 0)")
    others = [f"/dev/nvidia{d.minor}" for d in devices[1:] if d.minor is not None and Path(f"/dev/nvidia{d.minor}").exists()]
    shared = [p for p in ("/dev/nvidiactl", "/dev/nvidia-uvm") if Path(p).exists()]
    try:
        os.close(device_filter.load([gpu0.minor]))
    except OSError as e:
        if e.errno == errno.EPERM:
            pytest.skip(f"this kernel or container refuses a cgroup device program to root: {e.strerror} (EPERM)")
        raise
    with scratch_cgroup("spx-gpu-devfilter") as scratch:
        mine, none = scratch / "gpu0", scratch / "none"
        mine.mkdir()
        none.mkdir()
        device_filter.confine(mine, [gpu0.minor])
        device_filter.confine(none, [])

        seen = open_in(mine, [node, *others, *shared])
        assert seen[node] == "opened", f"GPU 0 (minor {gpu0.minor}) refused to its own cgroup: {seen}"
        assert all(seen[p] == "EPERM" for p in others), f"another GPU's node opened: {seen}"
        assert all(seen[p] == "opened" for p in shared), f"nvidiactl / nvidia-uvm must stay open: {seen}"

        seen = open_in(none, [node, *shared])
        assert seen[node] == "EPERM", f"a cgroup allowed no GPU opened {node}: {seen}"
        assert all(seen[p] == "opened" for p in shared), seen
