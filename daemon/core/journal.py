"""The native journal protocol: each daemon line as a journal entry with its own fields, so that
`journalctl -u spx-trainer -p err` shows the errors and `journalctl SPX_JOB=NAME` a job's lines.

Why not stdout: under systemd, stdout is a stream into journald, which stores every line at the
unit's one priority (6, info) with the whole JSON in MESSAGE; no filter by level or by job can work.

The protocol (systemd.journal-fields(7), sd_journal_sendv): one datagram to
/run/systemd/journal/socket of `KEY=VALUE\\n` lines; a value holding a newline is sent as `KEY\\n`, its
length as 64-bit little-endian, the bytes, `\\n`. An entry too large for one datagram goes as a sealed
memfd passed over the socket, as sd_journal does. journald takes the sender's pid, uid and unit from
the socket's credentials, so `-u spx-trainer` matches as it did for the stream.

Whether we run under journald is what sd_journal_stream_fd(3)'s users check: systemd sets
JOURNAL_STREAM to the device:inode of the stream it connected stdout or stderr to; only while fd 1 or
fd 2 is still that stream (not a pipe a test or a child's redirection put there) are lines sent
natively.

Stdlib only, like sd_notify: the protocol is a few lines.
"""

from __future__ import annotations

import array
import errno
import fcntl
import json
import os
import socket
import struct
from collections.abc import Mapping

JOURNAL_SOCKET = "/run/systemd/journal/socket"
IDENTIFIER = "spx-trainer"

# syslog(3) priorities, as journalctl -p reads them: 2 crit, 3 err, 4 warning, 6 info, 7 debug.
PRIORITIES = {"debug": 7, "info": 6, "warning": 4, "warn": 4, "error": 3, "exception": 3, "critical": 2}
DEFAULT_PRIORITY = 6

# Keys of a line that the entry carries in fields of its own, not in the readable MESSAGE.
_NOT_IN_SUMMARY = {"event", "level", "timestamp", "exception"}
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL


def under_journald(environ: Mapping[str, str], fds: tuple[int, ...] = (1, 2)) -> bool:
    """True when stdout or stderr (`fds`) is the journal stream systemd set up (JOURNAL_STREAM=DEV:INODE
    names whichever of the two it connected; StandardOutput=null with StandardError=journal is still
    a journal to write to)."""
    dev, sep, ino = environ.get("JOURNAL_STREAM", "").partition(":")
    if not (sep and dev.isdigit() and ino.isdigit()):
        return False
    for fd in fds:
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (int(dev), int(ino)):
            return True
    return False


def priority(level: object) -> int:
    return PRIORITIES.get(str(level).lower(), DEFAULT_PRIORITY)


def _logfmt(value: object) -> str:
    """A value as `key=value` shows it: bare when it is one plain word, JSON otherwise."""
    if isinstance(value, str):
        plain = value and not any(c.isspace() or c in '"=\\' for c in value)
        return value if plain else json.dumps(value, ensure_ascii=False)
    return json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))


def summary(event: Mapping[str, object]) -> str:
    """The readable MESSAGE: the event, then `key=value` for every field that has a value, then a
    traceback's lines when the line carries one (`journalctl -p err` shows it whole)."""
    words = [str(event.get("event", ""))]
    words += [f"{k}={_logfmt(v)}" for k, v in event.items() if k not in _NOT_IN_SUMMARY and v is not None]
    text = " ".join(words)
    if event.get("exception"):
        text += "\n" + str(event["exception"])
    return text


def entry(event: Mapping[str, object], json_line: str) -> dict[str, str]:
    """The journal fields of one log line. SPX_JSON keeps the line exactly as stdout would have had
    it, so nothing a JSON reader relied on is lost (`journalctl -o cat --output-fields=SPX_JSON`)."""
    fields = {
        "MESSAGE": summary(event),
        "PRIORITY": str(priority(event.get("level"))),
        "SYSLOG_IDENTIFIER": IDENTIFIER,
        "SPX_EVENT": str(event.get("event", "")),
    }
    if event.get("job") is not None:
        fields["SPX_JOB"] = str(event["job"])
    if event.get("attempt") is not None:
        fields["SPX_ATTEMPT"] = str(event["attempt"])
    fields["SPX_JSON"] = json_line
    return fields


def encode(fields: Mapping[str, str]) -> bytes:
    """One datagram: `KEY=VALUE\\n`, or the length-prefixed binary form for a value with a newline."""
    out = bytearray()
    for key, value in fields.items():
        data = value.encode("utf-8", "backslashreplace")
        if b"\n" in data:
            out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


class JournalSocket:
    """A datagram socket to journald. `send` raises OSError when journald does not take the entry."""

    def __init__(self, address: str = JOURNAL_SOCKET):
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    def send(self, datagram: bytes) -> None:
        try:
            self.sock.sendto(datagram, self.address)
        except OSError as e:
            if e.errno not in (errno.EMSGSIZE, errno.ENOBUFS):
                raise
            self._send_as_memfd(datagram)

    def _send_as_memfd(self, datagram: bytes) -> None:
        """An entry over the datagram size limit (a long traceback): journald reads it from a sealed
        memfd passed with SCM_RIGHTS and no payload."""
        fd = os.memfd_create("spx-journal-entry", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            view = memoryview(datagram)
            while view:
                view = view[os.write(fd, view):]
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            # sendmsg, not socket.send_fds: the latter drops the address before Python 3.12.
            self.sock.sendmsg([], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))], 0, self.address)
        finally:
            os.close(fd)

    def close(self) -> None:
        self.sock.close()
