"""`spx logs NAME -f` with a real daemon and a real job that crashes once (issue 26): started before
the crash, it shows attempt 1 (across the relay's rotation of its log), the separator line naming why
attempt 2 started, attempt 2 to its end, and exits when the job has succeeded. Afterwards the same
log read back whole (the rotated attempt-1.log.1 first), its tail, and attempts picked by --since.
And --rank on a real torchrun job's output."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness import BIN, Daemon, wait_for

SCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"
PY = sys.executable
LINES = 120  # × 51 bytes: past the 4096-byte cap once, so attempt 1's log rotates while followed

pytestmark = pytest.mark.slow


class Follower:
    """`spx logs NAME -f` running, its lines collected as they come."""

    def __init__(self, daemon: Daemon, name: str):
        self.proc = subprocess.Popen([str(BIN / "spx"), "--root", str(daemon.root), "logs", name, "-f"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()

    def seen(self, line: str, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: line in self.lines, timeout)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.stderr and self.proc.poll() is not None else ""

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout=10)


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path / "root", config={"log_max_bytes": 4096}).start()
    yield d
    d.stop()


def test_follow_started_before_a_crash_shows_both_attempts_and_the_separator_and_ends_with_the_job(daemon, tmp_path):
    go = tmp_path / "go"
    daemon.drop("c.yaml", f"name: once\nlauncher: python\nscript: {SCRIPTS / 'crash_once.py'}\npython: {PY}\n"
                          f"args: ['{go}', '{LINES}']\nrestart: {{backoff_seconds: [1, 1]}}\n")
    wait_for(lambda: "one: started" in daemon.spx("logs", "once", check=False).stdout, 120, "attempt 1's first line")

    with Follower(daemon, "once") as follower:
        assert follower.seen("one: started", 60)
        go.touch()  # only now does attempt 1 write the rest of its log and crash
        assert follower.wait(240) == 0, follower.stderr()
    lines = follower.lines
    assert daemon.job("once")["state"] == "succeeded"

    numbered = [f"one: line {i:04d} " + "x" * 40 for i in range(LINES)]
    separator = next(i for i, line in enumerate(lines) if line.startswith("── attempt 2 "))
    # attempt 1 whole and in order, its rotation included, then its traceback, then the separator
    assert [x for x in lines[:separator] if x.startswith("one: ")] == ["one: started", *numbered], lines
    assert "RuntimeError: crashing on attempt 1 as planned" in lines[:separator], lines
    assert lines[separator].startswith("── attempt 2 (restart after: ") and lines[separator].endswith(" ──")
    assert "RuntimeError" in lines[separator], lines[separator]  # the root cause attempt 1 ended on
    # attempt 2 to its end: the daemon's notes (where it starts from, its argv: `spx: `), then its lines
    assert lines[separator + 1].startswith("spx: attempt 2 of job once "), lines[separator:]
    assert [x for x in lines[separator + 1:] if not x.startswith("spx: ")] == ["two: resumed", "two: done"]

    log_dir = daemon.root / "log" / "once"
    whole = daemon.spx("logs", "once", "--attempt", "1").stdout.splitlines()
    assert [x for x in whole if x.startswith("one: ")] == ["one: started", *numbered]  # .1 first, then the rest
    assert any(p.name == "attempt-1.log.1" for p in log_dir.iterdir()), sorted(log_dir.iterdir())
    assert daemon.spx("logs", "once", "--tail", "1").stdout == "two: done\n"
    # --since a long time back: every attempt, each under its separator; --tail after it
    # (attempt 2's four lines and attempt 1's last, over the separator)
    both = daemon.spx("logs", "once", "--since", "1d", "--tail", "5").stdout.splitlines()
    assert both[0] == "RuntimeError: crashing on attempt 1 as planned", both
    assert both[1].startswith("── attempt 2 (restart after: ") and both[-2:] == ["two: resumed", "two: done"], both
    assert len(both) == 6, both


def test_rank_keeps_one_ranks_lines_as_torchrun_prefixes_them(daemon, tmp_path):
    """2 workers under torchrun (its --tee prefix, `[default1]:`): --rank 1 shows rank 1's lines and
    spx's notes, none of rank 0's."""
    (tmp_path / "hello.py").write_text("import os\nfor i in range(3):\n    print('rank', os.environ['RANK'], 'line', i)\n")
    daemon.drop("r.yaml", f"name: ranks\nlauncher: torchrun\nscript: {tmp_path / 'hello.py'}\npython: {PY}\nprocs: 2\n")
    daemon.wait_state("ranks", "succeeded", 180)
    everything = daemon.spx("logs", "ranks").stdout.splitlines()
    assert "[default1]:rank 1 line 2" in everything and "[default0]:rank 0 line 2" in everything, everything
    one = daemon.spx("logs", "ranks", "--rank", "1").stdout.splitlines()
    assert [x for x in one if not x.startswith("spx: ")] == [f"[default1]:rank 1 line {i}" for i in range(3)], one
    assert any(x.startswith("spx: ") for x in one), one
    assert daemon.spx("logs", "ranks", "--rank", "0", "--tail", "1").stdout == "[default0]:rank 0 line 2\n"


def test_follow_reads_on_while_the_daemon_is_down_and_goes_on_with_the_restarted_one(daemon, tmp_path):
    """kill -9 of the daemon (its jobs run on, as under systemd): -f keeps reading the attempt's file
    while nothing answers; attempt 1 crashes meanwhile; the restarted daemon relaunches the job, and
    -f goes on to attempt 2 under its separator and ends with the job."""
    go = tmp_path / "go"
    daemon.drop("c.yaml", f"name: once\nlauncher: python\nscript: {SCRIPTS / 'crash_once.py'}\npython: {PY}\n"
                          f"args: ['{go}', '5']\nrestart: {{backoff_seconds: [1, 1]}}\n")
    wait_for(lambda: "one: started" in daemon.spx("logs", "once", check=False).stdout, 120, "attempt 1's first line")
    with Follower(daemon, "once") as follower:
        assert follower.seen("one: started", 60)
        daemon.kill9()
        go.touch()
        last = "one: line 0004 " + "x" * 40
        assert follower.seen(last, 60), (follower.lines, follower.proc.poll(), follower.stderr())  # read while no daemon runs
        assert follower.proc.poll() is None
        daemon.start()
        assert follower.wait(240) == 0, follower.stderr()
    lines = follower.lines
    separator = next(i for i, line in enumerate(lines) if line.startswith("── attempt 2 "))
    assert lines.index(last) < separator and lines[-2:] == ["two: resumed", "two: done"], lines
    assert daemon.job("once")["state"] == "succeeded"
