"""`spx logs`' reading of attempt logs (cli/log_lines.py, cli/logs.py's Output), on bytes and
in-memory files: the rank prefix torchrun and PyTorch put on lines, the timestamps `--since` dates
lines by, `--since`'s forms, the last N lines read from the end across the rotated `.1` part, and
the separator between attempts; and the command's reading of the files: the rotated part first,
--tail and --since across attempts, which attempts --since picks, following across a rotation."""

from __future__ import annotations

import io
import json
import os
import socket
import threading
import time
from datetime import datetime, timezone

import pytest

from spx.daemon.cli import log_lines
from spx.daemon.cli.client import CliError
from spx.daemon.cli.logs import Attempt, Followed, JobStatus, Output, chosen, show
from spx.daemon.core.config import DaemonConfig

NOW = datetime(2026, 12, 4, 21, 30, 0).timestamp()  # local time, as the job's loggers and the user's clock


def test_the_rank_is_the_number_in_the_first_prefix():
    assert log_lines.rank_of(b"[default0]:step 10 loss 2.3\n") == 0
    assert log_lines.rank_of(b"[default12]:step 10\n") == 12
    assert log_lines.rank_of(b"[default1]:[rank1]: Traceback (most recent call last):\n") == 1
    assert log_lines.rank_of(b"[rank3]:[W1204 21:34:35.502 ProcessGroupGloo.cpp:12] warning\n") == 3
    assert log_lines.rank_of(b"[0]:hello\n") == 0  # TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[${rank}]:"
    for unprefixed in (b"spx: attempt 2 resumed\n", b"[W1204 21:34:35.502] x\n",
                       b"[2026-12-04 21:34:35,502] [INFO] [launch.py:1] x\n", b"W1204 torch.distributed.run\n"):
        assert log_lines.rank_of(unprefixed) is None, unprefixed


def test_rank_filter_keeps_that_ranks_lines_and_the_daemons_notes_only():
    lines = [b"[default0]:a\n", b"[default1]:b\n", b"spx: hang: dumping stacks\n",
             b"WARNING:torch.distributed.elastic:Sending process 12 closing signal SIGTERM\n", b"[rank1]: boom\n"]
    assert [x for x in lines if log_lines.for_rank(x, 1)] == [b"[default1]:b\n", b"spx: hang: dumping stacks\n",
                                                               b"[rank1]: boom\n"]


@pytest.mark.parametrize(("line", "expected"), [
    (b"2026-12-04 21:34:35,502 - INFO - step 3\n", datetime(2026, 12, 4, 21, 34, 35, 502000).timestamp()),
    (b"[2026-12-04 21:34:35,502] [INFO] [engine.py:1] step 3\n", datetime(2026, 12, 4, 21, 34, 35, 502000).timestamp()),
    (b"[default0]:2026-12-04T21:34:35 step 3\n", datetime(2026, 12, 4, 21, 34, 35).timestamp()),
    (b"[default0]:[rank0]:2026-12-04 21:34:35.25 x\n", datetime(2026, 12, 4, 21, 34, 35, 250000).timestamp()),
    (b"2026-12-04T20:34:35Z x\n", datetime(2026, 12, 4, 20, 34, 35, tzinfo=timezone.utc).timestamp()),
    (b"2026-12-04T21:34:35.123456789+01:00 x\n", datetime(2026, 12, 4, 20, 34, 35, 123456, tzinfo=timezone.utc).timestamp()),
    (b"step 3 at 2026-12-04 21:34:35\n", None),  # a date inside the text is not the line's time
    (b"[default0]:step 3\n", None),
    (b"2026-13-45 99:99:99 nonsense\n", None),
])
def test_a_line_is_dated_by_the_timestamp_it_starts_with(line, expected):
    assert log_lines.line_time(line) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("10m", NOW - 600), ("90s", NOW - 90), ("2h", NOW - 7200), ("1d", NOW - 86400), ("1.5h", NOW - 5400),
    ("2026-12-04 21:00", datetime(2026, 12, 4, 21, 0).timestamp()),
    ("2026-12-04T20:00:00Z", datetime(2026, 12, 4, 20, 0, tzinfo=timezone.utc).timestamp()),
    ("21:05", datetime(2026, 12, 4, 21, 5).timestamp()),
    ("21:05:30", datetime(2026, 12, 4, 21, 5, 30).timestamp()),
])
def test_since_is_a_duration_back_a_date_time_or_a_time_today(text, expected):
    assert log_lines.parse_since(text, NOW) == expected


def test_since_that_is_no_time_says_what_is():
    with pytest.raises(ValueError, match="10m"):
        log_lines.parse_since("yesterday-ish", NOW)


def test_since_dates_undated_lines_by_the_timestamp_above_them_and_keeps_what_it_cannot_date():
    since = datetime(2026, 12, 4, 21, 0).timestamp()
    lines = [b"loading data\n",                                    # nothing above: cannot be dated, kept
             b"2026-12-04 20:50:00,000 INFO step 1\n",             # before: left out
             b"Traceback (most recent call last):\n",              # under the 20:50 line: left out
             b"2026-12-04 21:10:00,000 INFO step 2\n",             # after: kept
             b"  a continuation\n"]                                # under the 21:10 line: kept
    f = log_lines.SinceFilter(since)
    assert [x for x in lines if f.keep(x)] == [lines[0], lines[3], lines[4]]


def _lines(n: int, rank_of=lambda i: i % 2) -> list[bytes]:
    return [f"[default{rank_of(i)}]:line {i}\n".encode() for i in range(n)]


@pytest.mark.parametrize("block", [1, 3, 7, 64, 65536])
def test_reading_from_the_end_gives_the_forward_lines_reversed_whatever_the_block(block):
    data = b"a\n\nbb\r progress\r done\nccc\n\n" + b"x" * 20 + b"\nno newline at the end"
    forward = [p + b"\n" for p in data.split(b"\n")[:-1]] + [b"no newline at the end"]
    assert list(log_lines.reversed_lines(io.BytesIO(data), len(data), block)) == forward[::-1]
    assert list(log_lines.lines_upto(io.BytesIO(data), len(data))) == forward
    # up to an offset: what was there when the file was opened, not what came after
    cut = data.index(b"ccc")
    assert list(log_lines.reversed_lines(io.BytesIO(data), cut, block)) == forward[:3][::-1]
    assert list(log_lines.lines_upto(io.BytesIO(data), cut)) == forward[:3]


@pytest.mark.parametrize("forward", [False, True])
def test_the_last_n_lines_reach_into_the_rotated_part_when_the_current_one_has_fewer(forward):
    older, newer = _lines(10), _lines(3)
    newer = [x.replace(b"line", b"new") for x in newer]
    rotated, current = io.BytesIO(b"".join(older)), io.BytesIO(b"".join(newer))
    parts = [(rotated, len(rotated.getvalue())), (current, len(current.getvalue()))]
    assert log_lines.last_lines(parts, 5, None, forward) == older[-2:] + newer
    assert log_lines.last_lines(parts, 2, None, forward) == newer[-2:]
    assert log_lines.last_lines(parts, 100, None, forward) == older + newer
    assert log_lines.last_lines(parts, 0, None, forward) == []
    # with --rank: the last N of that rank's lines
    assert log_lines.last_lines(parts, 3, lambda x: log_lines.for_rank(x, 1), forward) == [
        older[7], older[9], newer[1]]


def test_the_separator_says_which_attempt_where_it_resumed_from_and_when_it_started():
    start = datetime(2026, 12, 4, 21, 3, 7).timestamp()
    assert log_lines.separator(2, "exit code 1", 40, "/ckpt/step-40", start) == \
        "── attempt 2 (restart after: exit code 1; resumed from step 40, started 2026-12-04 21:03:07) ──\n".encode()
    assert log_lines.separator(3, None, None, "/ckpt/model.pt", None) == "── attempt 3 (resumed from /ckpt/model.pt) ──\n".encode()
    assert log_lines.separator(2, None, None, None, None) == "── attempt 2 (from the start) ──\n".encode()


def test_output_filters_whole_lines_across_reads_and_puts_a_separator_on_a_line_of_its_own(tmp_path):
    out = io.BytesIO()
    o = Output(out)
    one, two = Attempt(1, tmp_path), Attempt(2, tmp_path, time.time(), None, 40, None, "hang: no step for 900 s")
    o.begin(one, lambda x: log_lines.for_rank(x, 0))
    for chunk in (b"[default0]:a\n[defa", b"ult1]:b\n[default0]:c wit", b"hout its end"):
        o.feed(chunk)
    o.begin(two, None)  # the attempt's last line, kept, ends before the separator
    o.feed(b"[default1]:unfiltered now\n")
    o.end_of_attempt()
    text = out.getvalue().decode()
    lines = text.splitlines()
    assert lines[:2] == ["[default0]:a", "[default0]:c without its end"]
    assert lines[2].startswith("── attempt 2 (restart after: hang: no step for 900 s; resumed from step 40, started ") and lines[3] == "[default1]:unfiltered now"
    assert len(lines) == 4


def test_the_first_attempt_shown_has_no_separator(tmp_path):
    out = io.BytesIO()
    o = Output(out)
    o.begin(Attempt(3, tmp_path), None)
    o.feed(b"x\n")
    assert out.getvalue() == b"x\n"


# --- the command's reading of the files (cli/logs.py), on real files in a temporary directory --------


def _attempt_files(log_dir, number: int, rotated: bytes | None, current: bytes | None, mtime: float | None = None):
    for suffix, data in ((".log.1", rotated), (".log", current)):
        if data is not None:
            path = log_dir / f"attempt-{number}{suffix}"
            path.write_bytes(data)
            if mtime is not None:
                os.utime(path, (mtime, mtime))


def test_an_attempt_is_shown_rotated_part_first_and_the_next_under_its_separator(tmp_path):
    _attempt_files(tmp_path, 1, b"a1 old\n", b"a1 new\n")
    _attempt_files(tmp_path, 2, None, b"a2\n")
    out = io.BytesIO()
    o = Output(out)
    followed = show([Attempt(1, tmp_path), Attempt(2, tmp_path, after="exit code 1")], o, None, None, None)
    assert out.getvalue() == "a1 old\na1 new\n── attempt 2 (restart after: exit code 1; from the start) ──\na2\n".encode()
    assert followed is not None and followed.path == tmp_path / "attempt-2.log"
    followed.close()


def test_tail_counts_back_across_attempts_and_only_shows_an_attempt_that_has_lines_in_it(tmp_path):
    _attempt_files(tmp_path, 1, b"one 1\none 2\n", b"one 3\n")
    _attempt_files(tmp_path, 2, None, b"two 1\ntwo 2\n")
    attempts = [Attempt(1, tmp_path), Attempt(2, tmp_path)]
    for n, expected in ((2, "two 1\ntwo 2\n"), (4, "one 2\none 3\n── attempt 2 (from the start) ──\ntwo 1\ntwo 2\n")):
        out = io.BytesIO()
        show(attempts, Output(out), None, None, n).close()
        assert out.getvalue() == expected.encode(), n


def test_since_skips_parts_last_written_before_it_and_dates_the_lines_of_one_that_spans_it(tmp_path):
    since = datetime(2026, 12, 4, 21, 0).timestamp()
    _attempt_files(tmp_path, 1, b"2026-12-04 20:40:00,000 old part\n", None, mtime=since - 600)
    _attempt_files(tmp_path, 1, None, b"2026-12-04 20:55:00,000 before\n  its traceback\n"
                                      b"2026-12-04 21:05:00,000 after\n", mtime=since + 300)
    out = io.BytesIO()
    show([Attempt(1, tmp_path, start=since - 1200)], Output(out), None, since, None).close()
    assert out.getvalue() == b"2026-12-04 21:05:00,000 after\n"
    # an attempt that started after it: every line, dated or not
    out = io.BytesIO()
    show([Attempt(1, tmp_path, start=since + 1)], Output(out), None, since, None).close()
    assert out.getvalue().count(b"\n") == 3


def test_the_attempts_since_a_time_are_those_that_had_not_ended_by_then():
    history = {1: {"end": 100.0}, 2: {"end": 200.0}, 3: {"end": None}}
    assert chosen(None, 3, history, 150.0) == [2, 3]
    assert chosen(None, 3, history, 50.0) == [1, 2, 3]
    assert chosen(None, 3, {}, 50.0) == [1, 2, 3]  # an earlier job's: the files decide
    assert chosen(2, 3, history, 150.0) == [2] and chosen(None, 3, history, None) == [3]
    assert chosen(None, 0, {}, None) == []


def test_following_across_a_rotation_reads_the_old_files_rest_then_the_new_one(tmp_path):
    path = tmp_path / "attempt-1.log"
    followed = Followed(path)
    assert followed.read() == b""  # the relay has not written yet: no file, nothing to read
    with path.open("ab") as relay:
        relay.write(b"first\n")
        relay.flush()
        assert followed.read() == b"first\n"
        relay.write(b"before the rename\n")
        relay.flush()
        path.rename(tmp_path / "attempt-1.log.1")  # the relay's rotation: the old file set aside...
        relay.write(b"left in the old one\n")
        relay.flush()
    path.write_bytes(b"in the new one\n")  # ...and a new one started
    assert b"".join(followed.drain()) == b"before the rename\nleft in the old one\nin the new one\n"
    with path.open("ab") as relay:
        relay.write(b"more\n")
    assert followed.read() == b"more\n" and followed.read() == b""
    followed.close()


def test_while_no_daemon_answers_follow_goes_on_with_the_last_status_and_says_so_once(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the not-running hint looks for sockets under the current directory
    status = JobStatus(DaemonConfig.rooted(tmp_path / "no-daemon-here"), "llama", 2)
    assert status.now() == {"attempts": 2, "state": "running"}  # neither socket nor store: the last known
    status.last = {"attempts": 3, "state": "running", "history": []}
    assert status.now() == status.last
    err = capsys.readouterr().err
    assert err.count("no daemon answers on ") == 1 and "reading on until one does" in err, err


def test_an_error_answer_ends_follow_only_when_it_persists(tmp_path):
    """A daemon killed mid-answer is one failed poll; a refusal (the job is no more) repeats and
    ends -f with its message."""
    cfg = DaemonConfig.rooted(tmp_path / "root")
    cfg.run_dir.mkdir(parents=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(cfg.socket_path))
    server.listen()
    replies = [{"ok": True, "result": {"attempts": 2, "state": "running"}}] + [{"ok": False, "error": "no job named 'llama'"}] * 3

    def answer() -> None:
        for reply in replies:
            conn, _ = server.accept()
            with conn:
                conn.makefile("rb").readline()
                conn.sendall(json.dumps(reply).encode() + b"\n")

    answering = threading.Thread(target=answer, daemon=True)
    answering.start()
    try:
        status = JobStatus(cfg, "llama", 1)
        assert status.now() == {"attempts": 2, "state": "running"}
        assert status.now() == status.now() == {"attempts": 2, "state": "running"}  # refused twice: the last known
        with pytest.raises(CliError, match="no job named"):
            status.now()
    finally:
        answering.join(timeout=10)
        server.close()
