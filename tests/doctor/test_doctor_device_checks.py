"""spx doctor's `gpu-devices` check: the running daemon's record of whether it confines jobs to their
GPUs' device nodes (run/device_filter.py), judged against the GPUs this host has."""

from __future__ import annotations

import json
import os

from spx.daemon.doctor.device_checks import check_gpu_devices, probe
from spx.daemon.doctor.report import DoctorContext
from spx.daemon.gpu.backend import GpuBackend, open_backend
from spx.daemon.run import device_filter


def ctx_with(tmp_path, record: object | None, gpus: bool = True) -> DoctorContext:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if record is not None:
        (run_dir / device_filter.RECORD).write_text(json.dumps(record))
    backend = open_backend("fake") if gpus else GpuBackend("none", "none: test", None)
    return DoctorContext(run_dir=run_dir, backend=backend)


def test_a_confining_daemon_is_ok_and_named(tmp_path):
    c = check_gpu_devices(ctx_with(tmp_path, {"enforced": True, "detail": device_filter.ENFORCED, "pid": os.getpid()}))
    assert c.status == "ok" and c.detail == f"{device_filter.ENFORCED} (daemon pid {os.getpid()})", c


def test_an_unconfined_host_with_gpus_fails_with_the_daemons_reason_and_fix(tmp_path):
    record = {"enforced": False, "detail": "the kernel refuses a cgroup device program: BPF_PROG_LOAD: Operation "
              "not permitted (EPERM)", "fix": device_filter.FIX_LOAD, "pid": 2 ** 22 + 1}
    c = check_gpu_devices(ctx_with(tmp_path, record))
    assert c.status == "fail" and "(EPERM)" in c.detail and "not running now" in c.detail, c
    assert c.fix == device_filter.FIX_LOAD


def test_without_gpus_an_unconfined_host_only_warns(tmp_path):
    record = {"enforced": False, "detail": "attempt cgroups are not managed (cgroups: off in the config)",
              "fix": device_filter.FIX_UNMANAGED, "pid": os.getpid()}
    c = check_gpu_devices(ctx_with(tmp_path, record, gpus=False))
    assert c.status == "warn" and c.fix == device_filter.FIX_UNMANAGED, c


def test_a_record_that_is_not_the_daemons_is_unknown(tmp_path):
    assert check_gpu_devices(ctx_with(tmp_path, ["not", "a", "record"])).status == "unknown"
    (tmp_path / "run" / device_filter.RECORD).write_text("{truncated")
    assert check_gpu_devices(DoctorContext(run_dir=tmp_path / "run")).status == "unknown"


def test_without_a_record_only_root_can_probe():
    c = probe(gpus=8, euid=1000)
    assert c.status == "unknown" and "only root" in c.detail, c
