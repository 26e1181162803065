"""`spx doctor`'s `py-spy` check: a hung job's worker stacks reach its attempt log only if the daemon
finds py-spy (beside its interpreter: a dependency of the package) and the kernel lets it read another
process. Proven, not assumed: py-spy dumps a python child of doctor's own, as the daemon dumps a
hung worker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from spx.daemon.doctor.check import Check
from spx.daemon.run.postmortem import PYSPY_TIMEOUT_SECONDS, pyspy_path

if TYPE_CHECKING:
    from spx.daemon.doctor.report import DoctorContext

NAME = "py-spy"
# The child waits on stdin (closed by doctor afterwards), so nothing it does depends on a clock.
_CHILD = "import sys\nprint('ready', flush=True)\nsys.stdin.read()\n"
FIX_INSTALL = (f"{sys.executable} -m pip install py-spy (a dependency of spx-trainer; systemd/install.sh "
               "installs it into the daemon's venv)")
FIX_PTRACE = ("py-spy reads the worker's memory: the daemon needs CAP_SYS_PTRACE (the shipped unit has it), "
              "kernel.yama.ptrace_scope below 3, and in a container --cap-add SYS_PTRACE")


def judge(pyspy: str | None, version: str, dumped: bool, dump_output: str, ptrace_scope: str | None) -> Check:
    """The check from what was found: py-spy's path and `--version`, and whether it dumped the child."""
    if pyspy is None:
        return Check(NAME, "fail", f"py-spy is not installed beside {sys.executable} nor on PATH: a hung job "
                     "is killed and restarted without its stacks in the log", FIX_INSTALL)
    if not version:
        return Check(NAME, "fail", f"{pyspy} does not run: {dump_output or 'no output'}", FIX_INSTALL)
    if ptrace_scope == "3":
        return Check(NAME, "fail", f"{version} ({pyspy}), but kernel.yama.ptrace_scope is 3: no process can "
                     "read another, a hung job's stacks cannot be dumped", FIX_PTRACE)
    if not dumped:
        tail = (dump_output.strip().splitlines() or ["no output"])[-1]
        return Check(NAME, "fail", f"{version} ({pyspy}) could not dump a python process: {tail}", FIX_PTRACE)
    return Check(NAME, "ok", f"{version} ({pyspy}): dumps a python process's stacks, as it will a hung job's")


def _ptrace_scope(proc_root: Path) -> str | None:
    try:
        return (proc_root / "sys" / "kernel" / "yama" / "ptrace_scope").read_text().strip()
    except OSError:
        return None  # no Yama: ptrace is governed by uid and CAP_SYS_PTRACE alone


def _dump_a_child(pyspy: str) -> tuple[bool, str]:
    """py-spy dump of a python child that is up and waiting: (a thread was shown, py-spy's output)."""
    child = subprocess.Popen([sys.executable, "-I", "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        assert child.stdout is not None
        child.stdout.readline()
        r = subprocess.run([pyspy, "dump", "--pid", str(child.pid)], capture_output=True, text=True,
                           timeout=PYSPY_TIMEOUT_SECONDS, stdin=subprocess.DEVNULL)
        out = (r.stdout + r.stderr).strip()
        return r.returncode == 0 and "Thread" in out, out
    except subprocess.TimeoutExpired:
        return False, f"py-spy dump took over {PYSPY_TIMEOUT_SECONDS:.0f} s"
    finally:
        child.kill()
        child.communicate()


def check_pyspy(ctx: DoctorContext) -> Check:
    pyspy = pyspy_path()
    if pyspy is None:
        return judge(None, "", False, "", None)
    try:
        r = subprocess.run([pyspy, "--version"], capture_output=True, text=True, timeout=15, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return judge(pyspy, "", False, str(e), None)
    version = r.stdout.strip() if r.returncode == 0 else ""
    if not version:
        return judge(pyspy, "", False, (r.stderr or r.stdout).strip(), None)
    scope = _ptrace_scope(ctx.proc_root)
    if scope == "3":
        return judge(pyspy, version, False, "", scope)
    dumped, output = _dump_a_child(pyspy)
    return judge(pyspy, version, dumped, output, scope)
