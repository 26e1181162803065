"""spx doctor's judgements, from the facts each check gathers (no process is run): any GPU count is a
host and only what costs a job is a warning; the driver's versions; py-spy, the daemon's cgroup and
the job environment as an unprivileged user; and no word of the project's history in any output."""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path

import pytest

from spx.daemon.doctor import cgroup_checks, gpu_checks, stackdump_checks, worker_checks
from spx.daemon.doctor.report import DoctorContext
from spx.daemon.gpu.backend import GpuBackend
from spx.daemon.gpu.fake import DEFAULT_FIXTURE, FakeNvml

GIB = 1 << 30
H100 = ("NVIDIA H100 80GB HBM3", 80 * GIB)
L4 = ("NVIDIA L4", 24 * GIB)


# --- GPU count and models ------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 3, 4, 8, 16])
def test_any_number_of_gpus_of_one_model_is_ok(count):
    c = gpu_checks.judge_gpus([H100] * count)
    assert (c.status, c.detail) == ("ok", f"{count}× NVIDIA H100 80GB HBM3 (80.0 GiB each)")


def test_gpus_of_mixed_models_are_a_warning_that_names_both():
    c = gpu_checks.judge_gpus([H100, H100, L4])
    assert c.status == "warn" and c.detail.startswith("2× NVIDIA H100 80GB HBM3, 1× NVIDIA L4 (24.0 to 80.0 GiB)")
    assert "slower one's pace" in c.detail and "one model" in c.fix


def test_one_model_with_different_memory_is_a_warning():
    c = gpu_checks.judge_gpus([H100, (H100[0], 40 * GIB)])
    assert c.status == "warn" and "must fit the smallest" in c.detail


def test_the_fake_backend_is_named():
    assert gpu_checks.judge_gpus([H100] * 8, fake=True).detail.endswith("(fake backend)")


def fake_backend(count: int) -> GpuBackend:
    fixture = copy.deepcopy(json.loads(DEFAULT_FIXTURE.read_text()))
    fixture["devices"] = fixture["devices"][:count]
    nvml = FakeNvml(fixture)
    nvml.nvmlInit()
    return GpuBackend("fake", "fake: test fixture", nvml, nvml.driver_version)


@pytest.mark.parametrize("count", [1, 2, 8])
def test_check_gpus_on_the_fake_nvml_judges_the_count_it_sees(count):
    with fake_backend(count) as b:
        c = gpu_checks.check_gpus(DoctorContext(backend=b))
    assert c.status == "ok" and c.detail.startswith(f"{count}× NVIDIA H100 80GB HBM3")


def test_no_gpus_at_all_is_a_cpu_host_not_a_failure(tmp_path):
    none = GpuBackend("none", "none: NVML not available", None)
    ctx = DoctorContext(backend=none, proc_root=tmp_path)
    gpus, driver = gpu_checks.check_gpus(ctx), gpu_checks.check_driver(ctx)
    assert gpus.status == "warn" and "only CPU jobs" in gpus.detail
    assert driver.status == "warn" and driver.detail.startswith("no NVIDIA driver loaded")


# --- the driver ----------------------------------------------------------------------------------


def proc_with_driver(tmp_path: Path, line: str) -> Path:
    (tmp_path / "driver" / "nvidia").mkdir(parents=True)
    (tmp_path / "driver" / "nvidia" / "version").write_text(line + "\nGCC version:  gcc version 12.2.0\n")
    return tmp_path


@pytest.mark.parametrize("line", [
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri May 31 09:35:42 UTC 2024",
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.90.07  Release Build  (dvs-builder@U16)",
])
def test_the_kernel_modules_version_is_read_from_proc(tmp_path, line):
    assert gpu_checks.kernel_driver_version(proc_with_driver(tmp_path, line)) == "550.90.07"


def test_a_loaded_driver_whose_nvml_does_not_answer_fails(tmp_path):
    proc = proc_with_driver(tmp_path, "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri")
    none = GpuBackend("none", "none: NVML not available (NVML Shared Library Not Found)", None)
    c = gpu_checks.check_driver(DoctorContext(backend=none, proc_root=proc))
    assert c.status == "fail" and "kernel driver 550.90.07 is loaded, but NVML does not answer" in c.detail


def test_nvml_answering_for_another_driver_than_the_loaded_module_fails(tmp_path):
    """The fake backend's driver is 550.90.07; a real backend's kernel module could lag an upgrade.
    The comparison itself is the same for both kinds: here the backend is called `nvml`."""
    proc = proc_with_driver(tmp_path, "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Fri")
    fake = fake_backend(2)
    as_real = GpuBackend("nvml", "nvml: test", fake.nvml, fake.driver_version)
    with fake:
        c = gpu_checks.check_driver(DoctorContext(backend=as_real, proc_root=proc))
    assert c.status == "fail" and c.detail.endswith("but the loaded kernel module is 535.183.01"), c


# --- py-spy --------------------------------------------------------------------------------------


def test_py_spy_missing_fails_and_says_what_a_hang_loses():
    c = stackdump_checks.judge(None, "", False, "", None)
    assert c.status == "fail" and "without its stacks" in c.detail and "pip install py-spy" in c.fix


def test_py_spy_that_dumps_a_process_is_ok():
    c = stackdump_checks.judge("/v/bin/py-spy", "py-spy 0.4.3", True, 'Thread 12 (idle): "MainThread"', None)
    assert c.status == "ok" and c.detail.startswith("py-spy 0.4.3 (/v/bin/py-spy)")


def test_py_spy_that_cannot_read_a_process_fails_with_the_ptrace_fix():
    c = stackdump_checks.judge("/v/bin/py-spy", "py-spy 0.4.3", False, "Error: Permission denied (os error 13)", "1")
    assert c.status == "fail" and c.detail.endswith("Permission denied (os error 13)") and "CAP_SYS_PTRACE" in c.fix
    locked = stackdump_checks.judge("/v/bin/py-spy", "py-spy 0.4.3", False, "", "3")
    assert locked.status == "fail" and "ptrace_scope is 3" in locked.detail


# --- the daemon's cgroup -------------------------------------------------------------------------

CG = Path("/sys/fs/cgroup")
LOADED = {"LoadState": "loaded", "Delegate": "yes", "ControlGroup": "/system.slice/spx-trainer.service"}


@pytest.mark.parametrize(("mode", "v2", "init", "props", "delegated", "status", "says"), [
    ("auto", CG, "systemd", LOADED, True, "ok", "/sys/fs/cgroup/system.slice/spx-trainer.service is marked delegated"),
    ("auto", CG, "systemd", LOADED, None, "ok", "Delegate=yes: its cgroup is the daemon's once it runs"),
    ("auto", CG, "systemd", LOADED, False, "warn", "no user.delegate xattr"),
    ("on", CG, "systemd", LOADED, False, "ok", "not marked, but cgroups: on"),
    ("auto", CG, "systemd", {**LOADED, "Delegate": "no"}, None, "fail", "does not delegate its cgroup (Delegate=no)"),
    ("auto", CG, "systemd", {"LoadState": "not-found"}, None, "unknown", "is not installed"),
    ("auto", None, "systemd", {}, None, "warn", "no cgroup v2 hierarchy"),
    ("off", CG, "systemd", LOADED, True, "warn", "cgroups: off in the config"),
    ("auto", CG, "tini", {}, None, "warn", "PID 1 is tini, not systemd"),
    ("on", CG, "tini", {}, None, "ok", "manages the cgroup it is started in"),
])
def test_cgroup_delegation(mode, v2, init, props, delegated, status, says):
    c = cgroup_checks.judge(mode, v2, init, "spx-trainer", props, delegated)
    assert (c.status, says in c.detail) == (status, True), c


def test_the_cgroup2_root_mount_is_found_not_a_bind_mount_of_a_subtree():
    mountinfo = ("30 1 0:26 /system.slice/x.service /sys/fs/cgroup/x rw - cgroup2 cgroup2 rw\n"
                 "31 1 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n")
    assert cgroup_checks._v2_root(mountinfo) == CG
    assert cgroup_checks._v2_root("22 1 0:20 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n") is None


# --- the job environment as an unprivileged user -------------------------------------------------


def test_an_interpreter_nobody_can_run_fails_with_the_install_fix():
    c = worker_checks.worker_access_check("/opt/spx-trainer/venv/bin/python", "nobody", None, False,
                                          "Permission denied (PermissionError)")
    assert c.status == "fail" and c.detail.startswith("nobody cannot run /opt/spx-trainer/venv/bin/python")
    assert "fail to launch" in c.detail and "install.sh" in c.fix


def test_an_interpreter_that_runs_but_finds_no_torch_fails():
    c = worker_checks.worker_access_check("/v/bin/python", "nobody", "3.11.2", False)
    assert c.status == "fail" and "finds no torch" in c.detail and "a+rX" in c.fix


def test_an_interpreter_every_user_runs_is_ok():
    c = worker_checks.worker_access_check("/v/bin/python", "nobody", "3.11.2", True)
    assert (c.status, c.detail) == ("ok", "/v/bin/python runs as nobody (Python 3.11.2) and finds torch")


def test_root_tries_as_nobody_and_anyone_else_as_themselves():
    assert worker_checks.unprivileged_user(0)[0] == "nobody"
    assert worker_checks.unprivileged_user(12345)[1] == 12345


# --- words -----------------------------------------------------------------------------------------

HISTORY_WORDS = ("seed", "offer", "baremetal", "provider")
DAEMON = Path(gpu_checks.__file__).resolve().parents[1]


def test_no_text_the_daemon_prints_speaks_of_the_projects_history():
    """Every string the daemon's code holds (docstrings aside) is about this host and its jobs: words
    from where the project came from mean nothing to an operator (doctor once said "the seed's setup
    is 4 or 8 GPUs", a checkpoint layout was called "seed")."""
    said = [f"{path.relative_to(DAEMON)}:{n.lineno}: {n.value!r}" for path in sorted(DAEMON.rglob("*.py"))
            for n in _string_constants(path) if any(w in n.value.lower() for w in HISTORY_WORDS)]
    assert not said


def _string_constants(path: Path) -> list[ast.Constant]:
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings]
