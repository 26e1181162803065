"""The per-attempt log relay: the attempt's stdout+stderr pipe → a size-capped, rotated log file.

    python -I -S .../spx/daemon/run/log_relay.py DIR_FD NAME MAX_BYTES UID GID MODE   (launcher.spawn runs this)

Why a relay and not the file as the attempt's stdout: a job that prints without end would fill the
log filesystem (shared with every other job, and often with the state store), and a full disk would
then fail the job's own writes with EPIPE-like errors it never expected. Between the pipe and the file
the relay can cap, rotate and, on ENOSPC, drop — while always draining the pipe, so the job never
blocks on its output.

Contract:
- Reads stdin (the read end of the attempt's pipe) until EOF — every writer gone — then exits 0.
- Appends to NAME inside the directory DIR_FD (root-owned; opened with O_APPEND|O_CREAT|O_NOFOLLOW,
  given MODE (octal) and fchown'd to UID:GID on its fd so the owner can read their log: 0600, or 0640
  with the config's `log_group` as GID — core.users.log_access). Before a write would take the file
  past MAX_BYTES it renames NAME to NAME.1 (replacing an older NAME.1, and keeping its owner and
  mode) and starts a new NAME: a job's logs use at most 2 × MAX_BYTES.
- A write that fails with ENOSPC, EDQUOT, EFBIG or EIO drops that output and counts it; the first
  write that works again is preceded by a line saying how many bytes were dropped and why.
- Never raises on the job's output; the daemon may write its own `spx:` notes into NAME at any time
  (the size is re-read before every write).

It runs as root (the log dir is root's), so, like enter_attempt.py, it is stdlib only and started
with `-I -S`, in its own session: a kill of the attempt's process group does not cut its log off.
"""

from __future__ import annotations

import errno
import os
import signal
import sys

CHUNK = 64 * 1024
# Errors that mean "the disk cannot take this now": output is dropped and counted, not fatal.
DROP_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}
OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Relay:
    """The file side of the relay: open, rotate, write or drop. One instance per attempt log."""

    def __init__(self, dir_fd: int, name: str, max_bytes: int, uid: int, gid: int, mode: int = 0o600):
        self.dir_fd = dir_fd
        self.name = name
        self.max_bytes = max(max_bytes, 1)
        self.uid = uid
        self.gid = gid
        self.mode = mode
        self.fd: int | None = None
        self.dropped = 0
        self.drop_reason: str | None = None

    def _open(self) -> int:
        if self.fd is None:
            fd = os.open(self.name, OPEN_FLAGS, self.mode, dir_fd=self.dir_fd)
            try:
                st = os.fstat(fd)
                if (st.st_mode & 0o170000) != 0o100000:  # not a regular file: never write into it
                    raise OSError(errno.EINVAL, "not a regular file", self.name)
                if st.st_mode & 0o7777 != self.mode:  # the umask's, or an older file's
                    os.fchmod(fd, self.mode)
                if (st.st_uid, st.st_gid) != (self.uid, self.gid):
                    os.fchown(fd, self.uid, self.gid)
            except OSError:
                os.close(fd)
                raise
            self.fd = fd
        return self.fd

    def _rotate(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        os.rename(self.name, self.name + ".1", src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)

    def _write_all(self, buf: bytearray) -> None:
        """Write `buf` into the current file, rotating first whenever it would pass the cap. What
        was written is removed from `buf`, so after an OSError `buf` holds what was not."""
        while buf:
            fd = self._open()
            room = self.max_bytes - os.fstat(fd).st_size
            if room <= 0:
                self._rotate()
                continue
            del buf[:os.write(fd, buf[:room])]

    def write(self, data: bytes) -> None:
        """Relay one chunk; what the disk cannot take is dropped and counted."""
        buf = bytearray(data)
        try:
            if self.dropped:
                self._write_all(bytearray(f"spx: {self.dropped} bytes of output dropped ({self.drop_reason})\n".encode()))
                self.dropped = 0
                self.drop_reason = None
            self._write_all(buf)
        except OSError as e:
            if self.fd is not None and e.errno in DROP_ERRNOS:
                os.close(self.fd)  # reopen on the next write: the file may have been rotated or removed
                self.fd = None
            self.dropped += len(buf)
            self.drop_reason = self.drop_reason or (os.strerror(e.errno) if e.errno else str(e))

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def relay(source_fd: int, sink: Relay) -> None:
    """Drain `source_fd` into `sink` until EOF. Reads never wait on writes that fail."""
    while True:
        try:
            data = os.read(source_fd, CHUNK)
        except InterruptedError:
            continue
        if not data:
            break
        sink.write(data)
    sink.close()


def main(argv: list[str]) -> int:
    dir_fd, name, max_bytes, uid, gid = int(argv[1]), argv[2], int(argv[3]), int(argv[4]), int(argv[5])
    mode = int(argv[6], 8)
    # The daemon's stop signals are for the daemon; the relay ends when its pipe does.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    relay(0, Relay(dir_fd, name, max_bytes, uid, gid, mode))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
