"""The daemon's log lines as journal entries (core/journal.py, core/log.py): the native protocol's
encoding, read back by a decoder written from systemd's description of it; the priority of each level;
the fields `journalctl SPX_JOB=…` and `-p err` filter on; over real AF_UNIX datagram sockets, as
journald receives them (an entry too large for a datagram in a sealed memfd); stdout when the journal
refuses, said once; and when the daemon counts as under journald at all."""

from __future__ import annotations

import io
import json
import os
import re
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from spx.daemon.core import journal, log


def decode(datagram: bytes) -> dict[str, str]:
    """The native protocol read back: `KEY=VALUE\\n`, or `KEY\\n` + 64-bit LE length + bytes + `\\n`."""
    fields: dict[str, str] = {}
    pos = 0
    while pos < len(datagram):
        newline = datagram.index(b"\n", pos)
        head = datagram[pos:newline]
        if b"=" in head:
            key, value = head.split(b"=", 1)
            pos = newline + 1
        else:
            key = head
            (size,) = struct.unpack_from("<Q", datagram, newline + 1)
            start = newline + 9
            value = datagram[start:start + size]
            assert datagram[start + size:start + size + 1] == b"\n"
            pos = start + size + 1
        fields[key.decode()] = value.decode()
    return fields


@pytest.fixture
def journald(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A bound datagram socket where journald's would be: (its path, the socket to read entries from)."""
    address = str(tmp_path / "journal.socket")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(address)
    s.settimeout(5)
    yield address, s
    s.close()


@pytest.fixture
def structlog_config():
    """configure() is process-wide: put back what the test found."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def test_a_value_with_a_newline_goes_length_prefixed_and_the_rest_as_key_value_lines():
    fields = {"MESSAGE": "attempt_ended job=a\nTraceback (most recent call last):\n  x", "PRIORITY": "3", "SPX_JOB": "a"}
    datagram = journal.encode(fields)
    assert datagram.startswith(b"MESSAGE\n" + struct.pack("<Q", len(fields["MESSAGE"].encode())))
    assert b"PRIORITY=3\nSPX_JOB=a\n" in datagram
    assert decode(datagram) == fields


def test_each_level_has_its_syslog_priority():
    assert {lvl: journal.priority(lvl) for lvl in ("debug", "info", "warning", "error", "critical")} == {
        "debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}
    assert journal.priority("exception") == 3 and journal.priority("WARNING") == 4
    assert journal.priority(None) == 6  # a line without a level: the stream's default


def test_an_entry_carries_the_job_its_attempt_the_event_and_the_json_line_whole():
    event = {"job": "llama", "attempt": 2, "exit_code": 1, "reason": "exit code 1", "next_state": "failed",
             "delay_seconds": None, "event": "attempt_ended", "level": "error", "timestamp": "2026-12-04T21:00:00Z"}
    line = json.dumps(event)
    fields = journal.entry(event, line)
    assert fields["PRIORITY"] == "3" and fields["SPX_JOB"] == "llama" and fields["SPX_ATTEMPT"] == "2"
    assert fields["SPX_EVENT"] == "attempt_ended" and fields["SYSLOG_IDENTIFIER"] == "spx-trainer"
    assert fields["SPX_JSON"] == line
    # readable: the event first, then key=value of what has a value; no timestamp or level (journald has both)
    assert fields["MESSAGE"] == 'attempt_ended job=llama attempt=2 exit_code=1 reason="exit code 1" next_state=failed'
    # every name is one journald accepts: upper case, digits, underscores, not starting with "_", at most 64
    assert all(re.fullmatch(r"[A-Z][A-Z0-9_]{0,63}", key) for key in fields)


def test_a_daemon_wide_line_has_no_job_fields_and_a_traceback_follows_its_summary():
    event = {"job": None, "attempt": None, "event": "loop_stage_failed", "level": "error", "stage": "intake",
             "exception": "Traceback (most recent call last):\nValueError: x"}
    fields = journal.entry(event, json.dumps(event))
    assert "SPX_JOB" not in fields and "SPX_ATTEMPT" not in fields
    assert fields["MESSAGE"] == "loop_stage_failed stage=intake\nTraceback (most recent call last):\nValueError: x"
    assert decode(journal.encode(fields))["MESSAGE"] == fields["MESSAGE"]


def test_under_journald_only_while_stdout_or_stderr_is_the_stream_systemd_named(tmp_path: Path):
    stream = os.open(tmp_path / "stream", os.O_WRONLY | os.O_CREAT)
    other = os.open(tmp_path / "other", os.O_WRONLY | os.O_CREAT)
    try:
        st = os.fstat(stream)
        named = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert journal.under_journald(named, (stream, other))
        assert journal.under_journald(named, (other, stream))  # StandardOutput=null, StandardError=journal
        assert not journal.under_journald(named, (other, other))  # redirected since (a test's pipe, a child's file)
        assert not journal.under_journald(named, (other, 10_000))  # a closed fd is no stream
        assert not journal.under_journald({}, (stream, stream))
        assert not journal.under_journald({"JOURNAL_STREAM": "garbage"}, (stream, stream))
    finally:
        os.close(stream)
        os.close(other)


def test_log_lines_reach_the_journal_socket_as_entries_through_structlog(journald, structlog_config):
    address, sock = journald
    stdout = io.StringIO()
    log.configure("debug", log.JournalSink(journal.JournalSocket(address), log.StdoutSink(stdout)))
    logger = log.get_logger()
    logger.bind(job="llama", attempt=3).warning("attempt_ended", reason="hang: no step progress for 900 s")
    logger.debug("turn", job=None)
    first, second = decode(sock.recv(65536)), decode(sock.recv(65536))
    assert (first["PRIORITY"], first["SPX_JOB"], first["SPX_ATTEMPT"], first["SPX_EVENT"]) == ("4", "llama", "3", "attempt_ended")
    assert json.loads(first["SPX_JSON"])["reason"] == "hang: no step progress for 900 s"
    assert second["PRIORITY"] == "7" and "SPX_JOB" not in second
    assert stdout.getvalue() == ""


def test_an_entry_over_the_datagram_limit_goes_in_a_sealed_memfd(journald):
    address, sock = journald
    sender = journal.JournalSocket(address)
    sender.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # the datagram limit, made small
    datagram = journal.encode({"MESSAGE": "x" * 300_000, "PRIORITY": "3"})
    sender.send(datagram)
    payload, fds, _flags, _addr = socket.recv_fds(sock, 16, 1)
    assert payload == b"" and len(fds) == 1
    try:
        assert os.pread(fds[0], len(datagram) + 1, 0) == datagram
        with pytest.raises(PermissionError):  # sealed: the sender can no longer change what journald reads
            os.pwrite(fds[0], b"y", 0)
    finally:
        os.close(fds[0])
    sender.close()


def test_a_refused_entry_goes_to_stdout_and_the_refusal_is_said_once_until_the_journal_takes_lines_again(tmp_path: Path):
    address = str(tmp_path / "journal.socket")
    stdout = io.StringIO()
    sink = log.JournalSink(journal.JournalSocket(address), log.StdoutSink(stdout))

    def line(n: int) -> tuple[str, dict]:
        event = {"event": f"e{n}", "level": "info", "job": None, "attempt": None}
        return json.dumps(event), event

    sink.write(*line(1))  # no socket there: refused
    sink.write(*line(2))
    written = [json.loads(x) for x in stdout.getvalue().splitlines()]
    assert [w["event"] for w in written] == ["journal_refused", "e1", "e2"]
    assert written[0]["level"] == "warning" and written[0]["socket"] == address and "No such file" in written[0]["error"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as journald:
        journald.bind(address)
        sink.write(*line(3))
        assert decode(journald.recv(65536))["SPX_EVENT"] == "e3"
    sink.write(*line(4))  # journald went away again: said again
    assert [json.loads(x)["event"] for x in stdout.getvalue().splitlines()][3:] == ["journal_refused", "e4"]


def test_outside_journald_lines_are_json_on_stdout(structlog_config):
    stdout = io.StringIO()
    log.configure("info", log.StdoutSink(stdout))
    log.get_logger().info("daemon_started", version="x")
    doc = json.loads(stdout.getvalue())
    assert (doc["event"], doc["level"], doc["job"], doc["attempt"], doc["version"]) == ("daemon_started", "info", None, None, "x")
