"""spx doctor's `gpu-devices` check: the running daemon's record of whether it confines jobs to their
GPUs' device nodes (run/device_filter.py)."""

from __future__ import annotations

import json
import os

from spx.daemon.doctor.device_checks import check_gpu_devices, probe
from spx.daemon.doctor.report import DoctorContext
from spx.daemon.run import device_filter


def ctx_with(tmp_path, record: object | None) -> DoctorContext:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if record is not None:
        (run_dir / device_filter.RECORD).write_text(json.dumps(record))
    return DoctorContext(run_dir=run_dir)


def test_a_confining_daemon_is_ok_and_named(tmp_path):
    c = check_gpu_devices(ctx_with(tmp_path, {"enforced": True, "detail": device_filter.ENFORCED, "pid": os.getpid()}))
    assert c.status == "ok" and c.detail == f"{device_filter.ENFORCED} (daemon pid {os.getpid()})", c


def test_an_unconfining_daemon_is_a_warning_with_its_reason_and_fix(tmp_path):
    record = {"enforced": False, "detail": "the kernel refuses a cgroup device program: BPF_PROG_LOAD: Operation "
              "not permitted (EPERM)", "fix": device_filter.FIX_LOAD, "pid": 2 ** 22 + 1}
    c = check_gpu_devices(ctx_with(tmp_path, record))
    assert c.status == "warn" and "(EPERM)" in c.detail and "not running now" in c.detail, c
    assert c.fix == device_filter.FIX_LOAD


def test_a_record_that_is_not_the_daemons_is_unknown(tmp_path):
    assert check_gpu_devices(ctx_with(tmp_path, ["not", "a", "record"])).status == "unknown"
    (tmp_path / "run" / device_filter.RECORD).write_text("{truncated")
    assert check_gpu_devices(DoctorContext(run_dir=tmp_path / "run")).status == "unknown"


def test_without_a_record_only_root_can_probe():
    c = probe(euid=1000)
    assert c.status == "unknown" and "only root" in c.detail, c
