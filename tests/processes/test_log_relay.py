"""The log relay as a real process on a real pipe: it caps and rotates, drops (and counts) what a full
disk cannot take without ever blocking the writer, and exits when the writer's end closes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import small_tmpfs, wait_for
from spx.daemon.core.users import LogAccess
from spx.daemon.run import launcher

KIB = 1024


class RelayUnderTest:
    """A relay started as spawn starts it, fed from a pipe this test writes."""

    def __init__(self, log_dir: Path, name: str, max_bytes: int, readers: LogAccess | None = None):
        self.dir_fd = os.open(log_dir, os.O_RDONLY | os.O_DIRECTORY)
        r, self.w = os.pipe()
        try:
            self.proc = launcher.start_relay(self.dir_fd, name, max_bytes, readers or LogAccess(os.getuid(), os.getgid()), r)
        finally:
            os.close(r)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.w, view):]

    def close(self, timeout: float = 30) -> int:
        if self.w >= 0:
            os.close(self.w)
            self.w = -1
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            os.close(self.dir_fd)


@pytest.fixture
def relay(tmp_path) -> Iterator[callable]:
    started: list[RelayUnderTest] = []

    def start(max_bytes: int, log_dir: Path = tmp_path, name: str = "attempt-1.log",
              readers: LogAccess | None = None) -> RelayUnderTest:
        started.append(RelayUnderTest(log_dir, name, max_bytes, readers))
        return started[-1]

    yield start
    for r in started:
        if r.w >= 0:
            r.close()


def lines(n: int, start: int = 0) -> bytes:
    return b"".join(b"%08d %s\n" % (i, b"y" * 90) for i in range(start, start + n))


def test_eof_ends_the_relay_with_everything_written(relay, tmp_path):
    r = relay(1024 * KIB)
    r.write(b"hello\nworld\n")
    assert r.close() == 0
    assert (tmp_path / "attempt-1.log").read_bytes() == b"hello\nworld\n"
    assert oct((tmp_path / "attempt-1.log").stat().st_mode & 0o777) == oct(0o600), "the owner's alone"


def test_a_log_group_reads_the_log_and_an_older_files_mode_is_corrected(relay, tmp_path):
    (tmp_path / "attempt-1.log").write_bytes(b"before\n")
    (tmp_path / "attempt-1.log").chmod(0o644)  # an older daemon's, or the umask's
    r = relay(1024 * KIB, readers=LogAccess(os.getuid(), os.getgid(), group_reads=True))
    r.write(b"after\n")
    assert r.close() == 0
    st = (tmp_path / "attempt-1.log").stat()
    assert (oct(st.st_mode & 0o777), st.st_gid) == (oct(0o640), os.getgid())
    assert (tmp_path / "attempt-1.log").read_bytes() == b"before\nafter\n"


def test_the_log_rotates_at_the_cap_and_keeps_one_older_file(relay, tmp_path):
    cap = 64 * KIB
    data = lines(5000)  # ~500 KiB: several rotations
    r = relay(cap)
    r.write(data)
    assert r.close() == 0
    log, old = tmp_path / "attempt-1.log", tmp_path / "attempt-1.log.1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attempt-1.log", "attempt-1.log.1"]
    assert old.stat().st_size == cap and 0 < log.stat().st_size <= cap
    kept = old.read_bytes() + log.read_bytes()
    assert data.endswith(kept), "the two files hold the newest output, in order, nothing lost between them"


def test_a_note_written_by_the_daemon_counts_toward_the_cap(relay, tmp_path):
    log = tmp_path / "attempt-1.log"
    log.write_bytes(b"spx: attempt 1 header\n" * 150)  # what the daemon wrote before the spawn
    r = relay(4 * KIB)
    r.write(b"x" * 1000 + b"\n")
    assert r.close() == 0
    assert (tmp_path / "attempt-1.log.1").read_bytes().startswith(b"spx: attempt 1 header\n")
    assert log.stat().st_size <= 4 * KIB


def test_a_symlink_in_place_of_the_log_is_not_followed(relay, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    (tmp_path / "attempt-1.log").symlink_to(target)
    r = relay(64 * KIB)
    r.write(b"secret\n")
    assert r.close() == 0
    assert target.read_bytes() == b""


def test_a_writer_that_never_stops_is_never_blocked_and_the_disk_use_stays_capped(tmp_path):
    cap = 256 * KIB
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    r, w = os.pipe()
    # The flood: a child writing 64 KiB blocks as fast as it can, counting what it got out.
    count = tmp_path / "written"
    flood = subprocess.Popen(
        [sys.executable, "-c", "import os, sys\nn = 0\nblock = b'z' * 65535 + b'\\n'\n"
         "while True:\n    n += os.write(1, block)\n    if n % (64 << 20) < 65536: open(sys.argv[1], 'w').write(str(n))\n",
         str(count)], stdout=w)
    try:
        proc = launcher.start_relay(dir_fd, "attempt-1.log", cap, LogAccess(os.getuid(), os.getgid()), r)
    finally:
        os.close(r)
        os.close(w)
    try:
        # 256 MiB through the relay in a bounded time: the writer is never held up by a capped log.
        wait_for(lambda: count.exists() and int(count.read_text() or 0) >= 256 << 20, 60, "256 MiB of output")
        used = sum(p.stat().st_size for p in tmp_path.glob("attempt-1.log*"))
        assert used <= 2 * cap
    finally:
        flood.kill()
        flood.wait()
    assert proc.wait(timeout=30) == 0, "the writer's death is EOF: the relay exits"
    os.close(dir_fd)


@pytest.fixture
def small_fs(tmp_path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "small", "512k") as mnt:
        yield mnt


def test_enospc_drops_and_counts_output_without_blocking_and_notes_it_when_space_returns(relay, small_fs):
    filler = small_fs / "filler"
    filler.write_bytes(b"\0" * (384 * KIB))
    r = relay(1024 * KIB, log_dir=small_fs)
    before = lines(3000)  # ~300 KiB into ~128 KiB of room
    started = time.monotonic()
    r.write(before)
    assert time.monotonic() - started < 10, "a full disk must not hold the writer up"
    log = small_fs / "attempt-1.log"
    wait_for(lambda: log.exists() and log.stat().st_size > 0, 10, "the log")
    # All of `before` has been read once the size stops moving (nothing more fits).
    sizes = []
    wait_for(lambda: sizes.append(log.stat().st_size) or sizes[-5:].count(sizes[-1]) == 5 and len(sizes) >= 5,
             10, "the relay to settle", interval=0.1)
    filler.unlink()
    r.write(b"after\n")
    assert r.close() == 0
    text = log.read_bytes()
    m = re.search(rb"spx: (\d+) bytes of output dropped \(No space left on device\)\n", text)
    assert m, text[-300:]
    kept = text[: m.start()]
    assert before.startswith(kept), "what was written is the output, in order"
    assert len(kept) + int(m.group(1)) == len(before), "every byte is either in the log or counted as dropped"
    assert text[m.end():] == b"after\n"


def test_the_relay_outlives_sigterm_and_ends_at_eof(relay, tmp_path):
    r = relay(64 * KIB)
    r.write(b"before\n")
    wait_for(lambda: (tmp_path / "attempt-1.log").exists(), 10, "the log")
    r.proc.send_signal(signal.SIGTERM)
    r.write(b"after\n")
    assert r.close() == 0
    assert (tmp_path / "attempt-1.log").read_bytes() == b"before\nafter\n"
