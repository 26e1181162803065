"""The control socket: how `spx` asks the daemon things without write access to its store.

A Unix stream socket, one JSON request and one JSON reply per connection. The caller's uid comes
from the kernel (SO_PEERCRED), never from the request: a user sees and cancels only their own jobs;
root and members of `admin_group` see all. Reads are answered from a read-only view of the store (each
thread has its own connection); changes (cancel) are handed to the main loop, the store's only writer.

Any local user can connect, so no client may hold the socket for the others: each connection is served
on its own thread (at most MAX_CLIENTS at once, MAX_PER_UID of them for one uid; more get a "busy"
reply at once), the whole request must arrive within REQUEST_SECONDS (a client sending a byte every few
seconds is cut off, not waited for per recv), a request over MAX_REQUEST bytes is refused, and every
request gets a JSON reply -- an error one when it is malformed, late, too large or the answer failed.

The client (`request`, what `spx` uses) is bounded the same way against whatever listens where it
connects: the whole exchange has one deadline (not one per recv, which a server dripping a byte at a
time would stretch forever) and a reply over MAX_REPLY bytes is cut off with an error reply, never read
on into memory. `spx` connects only to the socket its config names (cli/socket_hint.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from spx.daemon.core.log import get_logger
from spx.daemon.service import requests
from spx.daemon.userfs import fsafe

log = get_logger()
MAX_REQUEST = 64 * 1024
# Far above any real reply (`spx ls --all` is ~0.5 KiB a job: some 100,000 jobs), far below harm.
MAX_REPLY = 64 * 1024 * 1024
MAX_CLIENTS = 32
MAX_PER_UID = 8
REQUEST_SECONDS = 5.0  # to receive the whole request line
REPLY_SECONDS = 5.0  # to hand the reply to a client that does not read it
LOOP_ANSWER_SECONDS = 30.0  # for the main loop to make a change (cancel, hold, drain, …)
SUN_PATH_BYTES = 108  # sockaddr_un's path field on Linux, its NUL included
RUN_DIR_MODE = 0o755  # the socket and the per-job heartbeat dirs are reached through it


@dataclass
class Command:
    """A change request for the main loop; `reply` is filled in and `done` set by it."""

    op: str
    name: str
    uid: int
    arg: str | None = None  # the request's value (`spx priority NAME N`: N)
    reply: dict = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)


def peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


class ControlServer:
    """Serves requests until `stop()`, which also ends and joins every connection's thread.
    `answer(op, name, uid, arg)` returns the reply to a read request (ls, history, status, gpus, …), and to
"adopt" (root only; `name` is the directory), which queues jobs through the main loop itself."""

    def __init__(
        self,
        path: Path,
        answer: Callable[[str, str | None, int, str | None], dict],
        commands: queue.SimpleQueue,
        wake: queue.SimpleQueue,
        admin_group: str | None = None,
    ):
        self.path = path
        self._admin_group = admin_group
        self._answer = answer
        self._commands = commands
        self._wake = wake
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # run_dir must be the daemon's alone (anything a user made there is moved aside): the unlink,
        # bind and chmod below go by name in it, and no one else can put a link at that name.
        run_fd = fsafe.open_root_dir(path.parent, RUN_DIR_MODE)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path.name, dir_fd=run_fd)
            # Bound through the dir fd just opened: nothing is resolved by name again, and a run dir
            # whose path is longer than sun_path's 108 bytes works all the same.
            self._sock.bind(f"/proc/self/fd/{run_fd}/{path.name}")
            # Anyone may connect; what they may see and do is decided per request from SO_PEERCRED.
            fsafe.chmod_socket_at(run_fd, path.name, 0o666)
        finally:
            os.close(run_fd)
        self._sock.listen(64)
        self._sock.settimeout(0.5)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="spx-control", daemon=True)
        self._lock = threading.Lock()
        self._clients: dict[threading.Thread, tuple[socket.socket, int]] = {}
        self._busy_logged = -1e9

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():  # a daemon that could not start never started it
            self._thread.join(timeout=5)
        self._sock.close()
        with self._lock:
            clients = list(self._clients.items())
        # First end the reading side only (a thread in recv wakes; one with an answer still sends it),
        # then cut whatever is left, e.g. a send to a client that does not read.
        for how, wait in ((socket.SHUT_RD, 1.0), (socket.SHUT_RDWR, 5.0)):
            deadline = time.monotonic() + wait
            for thread, (conn, _uid) in clients:
                if thread.is_alive():
                    try:
                        conn.shutdown(how)
                    except OSError:
                        pass
            for thread, _ in clients:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self.path.unlink(missing_ok=True)

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                self._dispatch(conn)
            except Exception as e:  # one bad client must never take the socket down
                log.warning("control_accept_failed", error=repr(e))
                conn.close()

    def _dispatch(self, conn: socket.socket) -> None:
        """Hand `conn` to a thread of its own, or answer "busy" at once when the caps are reached."""
        uid = peer_uid(conn)
        with self._lock:
            busy = len(self._clients) >= MAX_CLIENTS or (
                uid != 0 and sum(1 for _c, u in self._clients.values() if u == uid) >= MAX_PER_UID
            )
            if not busy:
                thread = threading.Thread(target=self._client, args=(conn, uid), name="spx-control-client", daemon=True)
                self._clients[thread] = (conn, uid)
                thread.start()
        if busy:
            now = time.monotonic()
            if now - self._busy_logged > 10:  # a client reconnecting in a loop must not flood the log
                self._busy_logged = now
                log.warning("control_busy", uid=uid, max_clients=MAX_CLIENTS, max_per_uid=MAX_PER_UID)
            conn.setblocking(False)  # the reply fits a fresh socket's buffer; never wait for this client
            try:
                conn.send(_encode({"ok": False, "error": "daemon busy: too many open requests; try again", "code": 1}))
            except OSError:
                pass
            conn.close()

    def _client(self, conn: socket.socket, uid: int) -> None:
        try:
            with conn:
                reply = self._reply(conn, uid)
                conn.settimeout(REPLY_SECONDS)
                conn.sendall(_encode(reply))
        except Exception as e:  # the client went away, or stop() shut the socket
            log.warning("control_request_failed", uid=uid, error=repr(e))
        finally:
            with self._lock:
                self._clients.pop(threading.current_thread(), None)

    def _reply(self, conn: socket.socket, uid: int) -> dict:
        data, problem = _receive(conn, self._stopping)
        if problem:
            return {"ok": False, "error": problem, "code": 2}
        try:
            request = json.loads(data)
            op, name, arg = str(request["op"]), request.get("name"), request.get("arg")
            if (name is not None and not isinstance(name, str)) or (arg is not None and not isinstance(arg, str)):
                raise TypeError("name")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return {"ok": False, "error": "malformed request: expected {\"op\": ..., \"name\": ...}", "code": 2}
        refused = requests.refusal(op, name, uid, self._admin_group)
        if refused is not None:
            return refused
        if requests.REQUESTS[op].on_loop:  # a change: made by the main loop
            return self._to_loop(Command(op, name or "", uid, arg))
        try:
            return self._answer(op, name, uid, arg)
        except Exception as e:
            log.exception("control_answer_failed", op=op, uid=uid)
            return {"ok": False, "error": f"the daemon could not answer {op}: {e}", "code": 1}

    def _to_loop(self, cmd: Command) -> dict:
        self._commands.put(cmd)
        self._wake.put("command")
        deadline = time.monotonic() + LOOP_ANSWER_SECONDS
        while not cmd.done.wait(timeout=0.2):
            if self._stopping.is_set():
                return {"ok": False, "error": f"daemon is stopping; the {cmd.op} may not have been recorded", "code": 1}
            if time.monotonic() > deadline:
                return {"ok": False, "error": "daemon busy; try again", "code": 1}
        return cmd.reply


def _receive(conn: socket.socket, stopping: threading.Event) -> tuple[bytes, str | None]:
    """One request line, or (partial data, why not): late, too large, or cut short."""
    deadline = time.monotonic() + REQUEST_SECONDS
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or stopping.is_set():
            return data, f"request not received within {REQUEST_SECONDS:g} s"
        conn.settimeout(min(left, 0.5))
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            continue
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST:
            return data, f"request larger than {MAX_REQUEST // 1024} KiB"
    return data, None


def _encode(reply: dict) -> bytes:
    return json.dumps(reply).encode() + b"\n"


def _connect(s: socket.socket, path: Path) -> None:
    """Connect by name, or through a fd of the socket's dir when the name does not fit sun_path (108
    bytes, the NUL included): a daemon under a deep --root still answers."""
    if len(os.fsencode(str(path))) < SUN_PATH_BYTES:
        s.connect(str(path))
        return
    dir_fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        s.connect(f"/proc/self/fd/{dir_fd}/{path.name}")
    finally:
        os.close(dir_fd)


def request(path: Path, op: str, name: str | None = None, timeout: float = 35.0, arg: str | None = None) -> dict:
    """Client side (used by `spx`). Raises OSError if the daemon is not listening, TimeoutError (an
    OSError) if the whole reply has not come within `timeout` seconds of the start; a connection closed
    without a reply, or a reply over MAX_REPLY bytes, is an error reply, not an exception."""
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        _connect(s, path)
        try:
            s.settimeout(max(deadline - time.monotonic(), 0.001))
            s.sendall(json.dumps({"op": op, "name": name, **({"arg": arg} if arg is not None else {})}).encode() + b"\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon answered (e.g. "busy") and closed before reading: its reply is still there
        data = bytearray()
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no whole reply on {path} within {timeout:g} s")
            s.settimeout(left)
            try:
                chunk = s.recv(min(1 << 20, MAX_REPLY + 1 - len(data)))
            except ConnectionResetError:
                break
            except TimeoutError:
                raise TimeoutError(f"no whole reply on {path} within {timeout:g} s") from None
            if not chunk:
                break
            data += chunk
            if len(data) > MAX_REPLY:
                return {"ok": False, "code": 1, "error": f"the reply on {path} is larger than {MAX_REPLY >> 20} MiB: "
                                                         "cut off unread (is that the daemon's socket?)"}
    try:
        reply = json.loads(data)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        return {"ok": False, "error": "the daemon closed the connection without a reply; see its log", "code": 1}
    return reply
