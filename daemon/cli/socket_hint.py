"""What `spx` says when no daemon answers on its socket, and which other sockets it may even ask.

`spx` sends its requests only to the socket its config names: `--root DIR` (or SPX_ROOT=DIR) gives
DIR/run/spx.sock, else the config's `run_dir` (default /run/spx/spx.sock). When nobody answers there,
a user who started the daemon with `spx-trainer --root ./spx-root` (the README's layout) has most
likely forgotten `--root`; so `spx` looks one level under the current directory for `*/run/spx.sock`,
asks each one it trusts for `ls` and, for one that answers, prints the `--root` that reaches it. It
never sends the command itself there.

Trusted means that no one but the caller or root controls it: `X/` and `X/run/` are real directories
(no links) owned by the invoking user or root and writable by no one else, and `spx.sock` is a socket
owned by one of them; when root runs `spx`, owned by root alone. Each component is opened from the
current directory's fd with O_NOFOLLOW and the socket is reached through the fd of `X/run/`
(/proc/self/fd/N/spx.sock), so nothing can be swapped in between the check and the connect. A
socket planted by another user (say in a shared directory where root runs `spx`) is never
connected to, only named as not asked. At most MAX_ENTRIES entries of the directory are looked at
and MAX_ASKED sockets asked, each with the client's deadline and reply cap (service/control.py).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from spx.daemon.core.config import DaemonConfig
from spx.daemon.service import control
from spx.daemon.userfs import fsafe

SOCKET = "spx.sock"
MAX_ENTRIES = 1000
MAX_ASKED = 8
ASK_SECONDS = 2.0


def trusted_owners() -> frozenset[int]:
    """Whose sockets `spx` may ask: root's, and the caller's own unless the caller is root."""
    return frozenset({0, os.geteuid()})


def _trusted_dir(st: os.stat_result, owners: frozenset[int]) -> bool:
    return stat.S_ISDIR(st.st_mode) and st.st_uid in owners and not st.st_mode & 0o022


def open_trusted_run_dir(cwd_fd: int, name: str) -> int | None:
    """fd of `name/run` under `cwd_fd` when it, `name` and its `spx.sock` are trusted (module doc);
    None when they are not, or not there. The caller closes the fd."""
    owners = trusted_owners()
    opened: list[int] = []
    try:
        parent = cwd_fd
        for part in (name, "run"):
            fd = fsafe.open_dir_at(parent, part)  # O_NOFOLLOW|O_DIRECTORY: no link, no FIFO
            opened.append(fd)
            if not _trusted_dir(os.fstat(fd), owners):
                return None
            parent = fd
        st = os.stat(SOCKET, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid not in owners:
            return None
        return opened.pop()
    except OSError:
        return None
    finally:
        for fd in opened:
            os.close(fd)


def _has_socket(cwd: Path, name: str) -> bool:
    """Whether `name/run/spx.sock` is there at all (lstat only: nothing is opened)."""
    try:
        return stat.S_ISSOCK(os.lstat(cwd / name / "run" / SOCKET).st_mode)
    except OSError:
        return False


def _candidates(cwd: Path) -> list[str]:
    """Names of the directory's entries (the first MAX_ENTRIES) that hold `run/spx.sock`, sorted."""
    names: list[str] = []
    try:
        with os.scandir(cwd) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_ENTRIES:
                    break
                if _has_socket(cwd, entry.name):
                    names.append(entry.name)
    except OSError:
        return []
    return sorted(names)


def find_answering(cfg: DaemonConfig, cwd: Path) -> tuple[list[Path], list[Path], list[Path]]:
    """(answering, silent, not asked): the trusted sockets under `cwd` that answer `ls`, those that
    do not, and those not trusted (never connected to). The configured socket is left out."""
    answering: list[Path] = []
    silent: list[Path] = []
    untrusted: list[Path] = []
    try:
        cwd_fd = fsafe.open_trusted_dir(cwd)  # the caller's own choice, as a path they typed
    except OSError:
        return answering, silent, untrusted
    try:
        for name in _candidates(cwd):
            sock = cwd / name / "run" / SOCKET
            if sock.absolute() == cfg.socket_path.absolute():
                continue
            run_fd = open_trusted_run_dir(cwd_fd, name)
            if run_fd is None:
                untrusted.append(sock)
                continue
            try:
                if len(answering) + len(silent) >= MAX_ASKED:
                    silent.append(sock)
                    continue
                reply = control.request(Path(f"/proc/self/fd/{run_fd}/{SOCKET}"), "ls", timeout=ASK_SECONDS)
            except OSError:
                silent.append(sock)
                continue
            finally:
                os.close(run_fd)
            (answering if reply.get("ok") is True else silent).append(sock)
    finally:
        os.close(cwd_fd)
    return answering, silent, untrusted


def not_running_message(cfg: DaemonConfig, cwd: Path | None = None) -> str:
    """Why `spx` got no answer, for the user who forgot `--root`: the socket tried, any trusted daemon
    socket one level under the current directory that does answer with the `--root` that reaches it,
    and the sockets found there that were not asked (not the caller's or root's)."""
    answering, silent, untrusted = find_answering(cfg, cwd or Path.cwd())
    skipped = ""
    if untrusted:
        whose = "root's" if os.geteuid() == 0 else "yours or root's"
        skipped = (f"\nnot asked: {', '.join(map(str, untrusted))} (not {whose}, or writable by others; "
                   "spx connects only to a socket no one else controls)")
    if answering:
        lines = [f"no daemon answers on {cfg.socket_path}, but one does on {', '.join(map(str, answering))}"]
        for sock in answering:
            root = sock.parent.parent.absolute()
            lines.append(f"use `spx --root {root} …` or `export SPX_ROOT={root}`")
        return "\n".join(lines) + skipped
    tried = ", ".join(map(str, [cfg.socket_path, *silent]))
    return (f"the daemon is not running (no answer on {tried}); if it runs with `spx-trainer --root DIR`, "
            "give `spx --root DIR …` or set SPX_ROOT=DIR, else start it with `spx-trainer`" + skipped)
