"""spx doctor on the real machine (real /proc, /sys, NVML if any, the real worker python) and with the
fake 8×H100 SXM5 backend, through the `spx` command line as users run it.

Expectations come from independent reads of the same sources (the cpuinfo flag, whether libnvidia-ml
loads), so on a bare-metal GPU host these tests check the opposite verdicts instead of failing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from spx.daemon.doctor.report import DoctorContext, exit_code, render_text, run_checks
from spx.daemon.gpu.backend import open_backend


def has_hypervisor_flag() -> bool:
    return any("hypervisor" in line.split() for line in Path("/proc/cpuinfo").read_text().splitlines()
               if line.startswith("flags"))


def nvml_loads() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def spx(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spx.daemon.cli.main", *args], capture_output=True, text=True,
                          timeout=300, env=env or {**os.environ, "SPX_ROOT": ""})


@pytest.fixture(scope="module")
def machine() -> dict[str, object]:
    with open_backend("auto") as backend:
        checks = run_checks(DoctorContext(backend=backend))
    return {c.name: c for c in checks} | {"_text": render_text(checks), "_exit": exit_code(checks)}


def test_this_machine_says_vm_truthfully(machine) -> None:
    host = machine["host"]
    if has_hypervisor_flag():
        assert host.status in ("ok", "warn") and host.detail.startswith("virtual machine"), "a VM is a normal host"
        assert "hypervisor flag in /proc/cpuinfo" in host.detail
    else:
        assert "hypervisor flag" not in host.detail


def test_this_machine_says_no_gpu_truthfully(machine) -> None:
    if nvml_loads():
        assert machine["gpus"].status in ("ok", "fail") and "no NVIDIA GPU" not in machine["gpus"].detail
        return
    assert machine["gpus"].status == "warn" and machine["gpus"].detail.startswith("no NVIDIA GPU visible")
    kernel_driver = Path("/proc/driver/nvidia/version").exists()
    assert machine["driver"].status == ("fail" if kernel_driver else "warn"), machine["driver"]
    assert machine["nvlink"].status == machine["bf16"].status == "unknown"


def test_this_machine_pid1_and_worker_env(machine) -> None:
    init = Path("/proc/1/comm").read_text().strip()
    if init != "systemd":
        assert machine["unit"].status == "unknown" and f"PID 1 is {init}" in machine["unit"].detail
    worker = machine["worker-env"]
    assert worker.status in ("ok", "warn") and "torch " in worker.detail, worker


def test_spx_doctor_command_line_on_this_machine() -> None:
    text = spx("doctor")
    assert text.stdout.splitlines()[-1].endswith("unknown") and "fix:" in text.stdout
    doc = json.loads(spx("doctor", "--json").stdout)
    assert [c["name"] for c in doc["checks"]][:5] == ["host", "gpus", "nvlink", "bf16", "driver"]
    assert doc["ok"] is (text.returncode == 0) is all(c["status"] != "fail" for c in doc["checks"])


def _others_can_run(path: str) -> bool:
    """Whether a user who is neither owner nor in the group can reach and execute `path`."""
    real = Path(os.path.realpath(path))
    dirs = {*Path(os.path.abspath(path)).parents, *real.parents}
    return all(os.stat(d).st_mode & 0o001 for d in dirs) and bool(os.stat(real).st_mode & 0o001)


def test_this_machine_says_truthfully_whether_others_can_run_the_job_environment(machine) -> None:
    access = machine["worker-access"]
    if os.geteuid() != 0:
        assert access.status == "ok", "the caller itself ran it"
    elif _others_can_run(sys.executable):
        assert access.status == "ok" and "runs as nobody" in access.detail, access
    else:
        assert access.status == "fail" and "nobody cannot run" in access.detail and "Permission denied" in access.detail


def test_this_machine_py_spy_dumps_a_python_process(machine) -> None:
    pyspy = machine["py-spy"]
    assert pyspy.status == "ok" and "dumps a python process's stacks" in pyspy.detail, pyspy


@pytest.fixture
def sandbox_root() -> Iterator[Path]:
    """A `--root` tree set up as the docs say: spool 1733, state 0700, and /checkpoints on its own
    (loop-mounted ext4) filesystem when this machine lets us mount one."""
    root = Path(tempfile.mkdtemp(prefix="spx-doctor-root-"))
    mounted = False
    try:
        (root / "spool").mkdir()
        (root / "spool").chmod(0o1733)
        (root / "state").mkdir(mode=0o700)
        (root / "checkpoints").mkdir()
        image = root / "ckpt.img"
        with open(image, "wb") as f:
            f.truncate(64 << 20)
        if subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True).returncode == 0:
            r = subprocess.run(["mount", "-o", "loop", str(image), str(root / "checkpoints")], capture_output=True)
            mounted = r.returncode == 0
        yield root
    finally:
        if mounted:
            subprocess.run(["umount", str(root / "checkpoints")], check=True)
        subprocess.run(["rm", "-rf", str(root)], check=True)


def test_spx_doctor_with_the_fake_backend(sandbox_root: Path) -> None:
    env = {**os.environ, "SPX_ROOT": ""}
    # The CLI has no --gpu-backend flag of its own: the fake comes from the config's gpu_backend.
    cfg = sandbox_root / "config.yaml"
    cfg.write_text("gpu_backend: fake\n")
    r = spx("--root", str(sandbox_root), "--config", str(cfg), "doctor", env=env)
    print(r.stdout)
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert any(x.startswith("✓ gpus") and "8× NVIDIA H100 80GB HBM3" in x and "fake backend" in x for x in lines)
    assert any(x.startswith("✗ nvlink") and "GPU 3: link 7 down" in x for x in lines)
    assert any(x.startswith("✓ bf16") for x in lines) and any(x.startswith("✓ driver") for x in lines)
    assert any(x.startswith("✓ spool") for x in lines) and any(x.startswith("✓ state") for x in lines)
    assert any(x.startswith("✓ worker-env") and "fake GPUs" in x for x in lines)
    assert any(x.startswith("✓ checkpoint-locks") and "flock holds between two processes" in x for x in lines)
    checkpoints = next(x for x in lines if x[2:].startswith("checkpoints"))
    if os.path.ismount(sandbox_root / "checkpoints"):
        # 64 MiB: a separate, persistent, writable mount, but far below the free-space floor.
        assert checkpoints.startswith("✗") and "ext4 /dev/loop" in checkpoints and "free" in checkpoints
    else:
        assert checkpoints.startswith("✗") and "root filesystem" in checkpoints
