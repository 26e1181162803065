"""Helpers shared by the staging tests (real files, real copier subprocesses)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from spx.daemon.staging import PART_SUFFIX, StageProgress, parse_event

# No .pyc writes by the copier: its wchar counter must be its copy plus its stdout, nothing else.
ENV = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}


def write(path: Path, data: bytes, mtime_ns: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))


def tree(root: Path) -> dict[str, tuple[bytes, int, int]]:
    """rel → (content, mtime_ns, mode) of the regular files under root (parts excluded)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink() and not p.name.endswith(PART_SUFFIX):
            st = p.stat()
            out[str(p.relative_to(root))] = (p.read_bytes(), st.st_mtime_ns, st.st_mode & 0o777)
    return out


def interrupt(argv: list[str], want_copied: int) -> tuple[int, list[str]]:
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


