"""Fixtures of the staging tests: killing a real copier subprocess mid-copy."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from spx.daemon.staging.copier import PART_SUFFIX, StageProgress, parse_event

# No .pyc writes by the copier: its wchar counter must be its copy plus its stdout, nothing else.
ENV = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}


def _interrupt(argv: list[str], want_copied: int) -> tuple[int, list[str]]:
    """Run the copier until it has copied want_copied bytes and a part file exists, then kill -9 it
    while it is stopped. Returns (wchar minus its stdout bytes = bytes it copied, stdout lines)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=ENV)
    lines: list[str] = []
    dst = Path(argv[4])
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            event = parse_event(line)
            if not isinstance(event, StageProgress) or event.bytes_copied < want_copied:
                continue
            os.kill(proc.pid, signal.SIGSTOP)
            if list(dst.rglob("*" + PART_SUFFIX)):
                io = Path(f"/proc/{proc.pid}/io").read_text()
                os.kill(proc.pid, signal.SIGKILL)
                break
            os.kill(proc.pid, signal.SIGCONT)  # between two files: try at the next report
        else:
            pytest.fail(f"copier finished before it could be interrupted: {lines[-1:]}")
        lines.extend(proc.stdout)  # what it wrote before the stop but we had not read yet
    finally:
        proc.kill()
        proc.wait()
    wchar = int(next(x for x in io.splitlines() if x.startswith("wchar:")).split()[1])
    return wchar - sum(len(x.encode()) for x in lines), lines




@pytest.fixture
def interrupt() -> Callable[[list[str], int], tuple[int, list[str]]]:
    """interrupt(argv, want_copied) → (bytes the copier copied before kill -9, its stdout lines)."""
    return _interrupt
