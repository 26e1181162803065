"""The control socket: how `spx` asks the daemon things without write access to its store.

A Unix stream socket, one JSON request and one JSON reply per connection. The caller's uid comes
from the kernel (SO_PEERCRED), never from the request: a user sees and cancels only their own jobs;
root and members of `admin_group` see all. Reads are answered on this thread from a read-only view
of the store; changes (cancel) are handed to the main loop, the store's only writer.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import queue
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from spx.daemon.service.log import get_logger

log = get_logger()
MAX_REQUEST = 64 * 1024


@dataclass
class Command:
    """A change request for the main loop; `reply` is filled in and `done` set by it."""

    op: str
    name: str
    uid: int
    reply: dict = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)


def peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def is_admin(uid: int, admin_group: str | None) -> bool:
    if uid == 0:
        return True
    if not admin_group:
        return False
    try:
        group = grp.getgrnam(admin_group)
        user = pwd.getpwuid(uid)
    except KeyError:
        return False
    return user.pw_gid == group.gr_gid or user.pw_name in group.gr_mem


class ControlServer:
    """Serves requests until `stop()`. `views(uid, name)` returns the job docs a caller may see."""

    def __init__(
        self,
        path: Path,
        answer: Callable[[str, str | None, int], dict],
        commands: queue.SimpleQueue,
        wake: queue.SimpleQueue,
    ):
        self.path = path
        self._answer = answer
        self._commands = commands
        self._wake = wake
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        # Anyone may connect; what they may see and do is decided per request from SO_PEERCRED.
        os.chmod(path, 0o666)
        self._sock.listen(16)
        self._sock.settimeout(0.5)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="spx-control", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        self._sock.close()
        self.path.unlink(missing_ok=True)

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(10)
                    self._handle(conn)
                except Exception as e:  # one bad client must never take the socket down
                    log.warning("control_request_failed", error=repr(e))

    def _handle(self, conn: socket.socket) -> None:
        uid = peer_uid(conn)
        data = b""
        while not data.endswith(b"\n") and len(data) <= MAX_REQUEST:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
        try:
            request = json.loads(data)
            op, name = str(request["op"]), request.get("name")
        except (ValueError, KeyError, TypeError):
            reply = {"ok": False, "error": "malformed request", "code": 2}
        else:
            if op in ("ls", "history", "status"):
                reply = self._answer(op, name, uid)
            elif op == "cancel" and isinstance(name, str):
                cmd = Command(op, name, uid)
                self._commands.put(cmd)
                self._wake.put("command")
                if cmd.done.wait(timeout=30):
                    reply = cmd.reply
                else:
                    reply = {"ok": False, "error": "daemon busy; try again", "code": 1}
            else:
                reply = {"ok": False, "error": f"unknown request {op!r}", "code": 2}
        conn.sendall(json.dumps(reply).encode() + b"\n")


def request(path: Path, op: str, name: str | None = None, timeout: float = 35.0) -> dict:
    """Client side (used by `spx`). Raises OSError if the daemon is not listening."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        s.sendall(json.dumps({"op": op, "name": name}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data)
