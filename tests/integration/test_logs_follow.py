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

    follower = subprocess.Popen([str(BIN / "spx"), "--root", str(daemon.root), "logs", "once", "-f"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        assert follower.stdout is not None
        for line in follower.stdout:
            lines.append(line.rstrip("\n"))
            if line == "one: started\n":
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert started.wait(60), f"spx logs -f did not show attempt 1's first line: {lines}"
        go.touch()  # only now does attempt 1 write the rest of its log and crash
        assert follower.wait(timeout=240) == 0, follower.stderr.read() if follower.stderr else ""
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        reader.join(timeout=10)
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
