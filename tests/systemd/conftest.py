"""A sandboxed systemd per test module, with spx-trainer installed into it by install.sh.

Booting takes a second or two; a module's tests share it and each leaves the unit stopped and its
jobs ended. Per module, not per session: it is gone before tests elsewhere run, so their leak guard
never sees (or kills) processes of a still-running sandbox.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from systemd_sandbox import Sandbox, cannot_run_reason, python_dirs

from harness import REPO

UNIT = "spx-trainer.service"
JOB_USER = "spxtest"
# Test-only settings: the wedge hook; quick restarts so the tests do not wait out RestartSec; and
# no nvidia-modprobe, which runs unsandboxed ('+') and would load modules into the host's kernel.
TEST_DROPIN = "[Service]\nEnvironment=SPX_TEST_HOOKS=1\nRestartSec=1s\nExecStartPre=\n"
KEEP = [REPO, *python_dirs()]
# Written before install.sh runs, which must keep it: the daemon runs on the fake 8-GPU backend.
TEST_CONFIG = "gpu_backend: fake\n"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Iterator[Sandbox]:
    why = cannot_run_reason()
    if why:
        pytest.skip(f"cannot boot systemd in a namespace here: {why}")
    sb = Sandbox(tmp_path_factory.mktemp("systemd"), keep=KEEP)
    try:
        sb.boot()
        sb.run("useradd", "--create-home", "--shell", "/bin/sh", JOB_USER)
        sb.write("/etc/spx/config.yaml", TEST_CONFIG)
        sb.install_log = sb.run("bash", str(REPO / "systemd" / "install.sh"), "--venv", sys.prefix).stdout
        sb.write(f"/etc/systemd/system/{UNIT}.d/test.conf", TEST_DROPIN)
        sb.systemctl("daemon-reload")
        yield sb
    finally:
        sb.close()


@pytest.fixture
def unit(sandbox):
    """The unit, stopped again after the test whatever happened (with its journal on failure)."""
    yield sandbox
    sandbox.systemctl("stop", UNIT, check=False)
    sandbox.systemctl("reset-failed", UNIT, check=False)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing systemd test prints the unit's journal: the only place its story is told."""
    outcome = yield
    rep = outcome.get_result()
    sb = item.funcargs.get("unit") or item.funcargs.get("sandbox")
    if rep.failed and isinstance(sb, Sandbox) and sb.pid:
        rep.sections.append(("journal of spx-trainer.service", sb.journal(UNIT)))
        logs = sb.path("/var/log/spx")
        for log in sorted([*logs.glob("*/attempt-*.log"), *logs.glob("*/attempt-*.ranks/**/std*.log")]):
            rep.sections.append((f"{log.relative_to(logs)} (last 40 lines)",
                                 "\n".join(log.read_text(errors="replace").splitlines()[-40:])))


@pytest.fixture
def leak_exempt_pids():
    """The suite's leak guard (tests/conftest.py) leaves the sandbox's processes alone: whatever runs
    under its systemd is the unit's business (the tests check it through systemd and /proc), and a
    guard that killed it would kill the daemon under test."""
    return Sandbox.all_pids
