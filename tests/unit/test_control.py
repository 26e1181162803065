"""The control socket serves clients concurrently (issue 12): a slow or oversized client is cut off
with an error reply, never blocks anyone else, and `stop()` ends every connection's thread. Real Unix
sockets and threads; the answer function stands in for the daemon's store."""

from __future__ import annotations

import json
import queue
import socket
import threading
import time

import pytest

from spx.daemon.service import control
from spx.daemon.service.control import ControlServer, request


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setattr(control, "REQUEST_SECONDS", 1.5)
    calls: list[tuple[str, str | None, int]] = []

    def answer(op, name, uid, arg=None):
        calls.append((op, name, uid))
        if name == "explode":
            raise RuntimeError("store went away")
        return {"ok": True, "result": [{"name": "j", "op": op}]}

    srv = ControlServer(tmp_path / "run" / "spx.sock", answer, queue.SimpleQueue(), queue.SimpleQueue())
    srv.start()
    srv.calls = calls
    yield srv
    srv.stop()


def _raw(path, payload: bytes, timeout=10.0) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        try:
            s.sendall(payload)
        except BrokenPipeError:  # the server replied and closed before reading it all
            pass
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data)


class SlowLoris:
    """A client that sends one byte every `every` seconds on its own thread until stopped; `started`
    is set once its first byte is out (its request is under way)."""

    def __init__(self, path, every=0.3):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.every = every
        self.reply = b""
        self.stopped = threading.Event()
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, name="slow-loris")
        self.thread.start()

    def _run(self):
        try:
            for byte in b'{"op": "ls", "name": null}':
                if self.stopped.wait(self.every):
                    return
                self.sock.send(bytes([byte]))
                self.started.set()
        except OSError:  # cut off by the server
            pass

    def read_reply(self, timeout=10.0) -> dict:
        self.sock.settimeout(timeout)
        data = b""
        while not data.endswith(b"\n"):
            chunk = self.sock.recv(4096)
            if not chunk:
                break
            data += chunk
        return json.loads(data)

    def close(self):
        self.stopped.set()
        self.thread.join()
        self.sock.close()


def _client_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "spx-control-client"]


# The server accepts connections in the order they were made, and hands each to a thread of its own
# (or answers "busy") before it accepts the next: a client connected before another is the server's
# by the time the later one is read.


def test_a_slow_client_blocks_nobody_and_is_cut_off_with_a_reply(server):
    loris = SlowLoris(server.path)
    try:
        assert loris.started.wait(10), "the slow client's request is under way on a connection of its own"
        start = time.monotonic()
        reply = request(server.path, "ls")
        assert reply == {"ok": True, "result": [{"name": "j", "op": "ls"}]}
        assert time.monotonic() - start < 0.5
        cut = loris.read_reply()
        assert cut["ok"] is False and "not received within 1.5 s" in cut["error"] and cut["code"] == 2
    finally:
        loris.close()


def test_the_deadline_is_for_the_whole_request_not_each_recv(server):
    loris = SlowLoris(server.path, every=0.2)  # a byte every 0.2 s never trips a per-recv timeout
    try:
        start = time.monotonic()
        reply = loris.read_reply()
        assert "not received within" in reply["error"]
        assert 1.4 < time.monotonic() - start < 3.0
    finally:
        loris.close()


def test_an_oversized_request_gets_an_error_reply(server):
    reply = _raw(server.path, b'{"op": "ls", "name": "' + b"x" * (control.MAX_REQUEST + 10) + b'"}\n')
    assert reply == {"ok": False, "error": "request larger than 64 KiB", "code": 2}
    assert request(server.path, "ls")["ok"]


@pytest.mark.parametrize("payload", [
    b"not json\n", b"[1, 2]\n", b'"ls"\n', b'{"name": "x"}\n', b'{"op": "status", "name": {"a": 1}}\n',
    b"[" * 60000 + b"\n",  # deep enough for a RecursionError in json
    b"\xff\xfe\n",
])
def test_malformed_requests_get_an_error_reply(server, payload):
    reply = _raw(server.path, payload)
    assert reply["ok"] is False and reply["code"] == 2 and reply["error"].startswith("malformed request")


def test_a_connection_closed_early_still_gets_a_reply(server):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(server.path))
        s.sendall(b'{"op": "ls"')
        s.shutdown(socket.SHUT_WR)
        s.settimeout(5)
        assert json.loads(s.recv(4096))["error"].startswith("malformed request")


def test_unknown_op_and_failing_answer_are_error_replies(server):
    assert request(server.path, "rm", "x") == {"ok": False, "error": "unknown request 'rm'", "code": 2}
    reply = request(server.path, "status", "explode")
    assert reply["ok"] is False and "could not answer status: store went away" in reply["error"]


def test_clients_past_the_cap_get_busy_at_once_and_slots_free_again(server, monkeypatch):
    monkeypatch.setattr(control, "MAX_CLIENTS", 4)  # MAX_PER_UID is shown with a real user in tests/hostile
    held = [SlowLoris(server.path, every=5) for _ in range(4)]  # connected first: the four slots are theirs
    try:
        busy = request(server.path, "ls")
        assert busy == {"ok": False, "error": "daemon busy: too many open requests; try again", "code": 1}
    finally:
        for loris in held:
            loris.close()
    for thread in _client_threads():  # the slots free as the server cuts the clients off
        thread.join(timeout=5)
    assert request(server.path, "ls")["ok"]


def test_stop_ends_every_client_thread_promptly(tmp_path, monkeypatch):
    monkeypatch.setattr(control, "MAX_CLIENTS", 3)  # a fourth client's "busy" says the three are held
    srv = ControlServer(tmp_path / "spx.sock", lambda *a: {"ok": True, "result": []}, queue.SimpleQueue(), queue.SimpleQueue())
    srv.start()
    held = [SlowLoris(srv.path, every=5) for _ in range(3)]
    assert request(srv.path, "ls")["code"] == 1, "the three slow clients hold every slot"
    assert len(_client_threads()) == 3
    start = time.monotonic()
    srv.stop()
    assert time.monotonic() - start < 2.0
    assert not [t for t in threading.enumerate() if t.name.startswith("spx-control")]
    assert not srv.path.exists()
    for loris in held:
        loris.close()


def test_a_cancel_waiting_for_the_main_loop_is_answered_at_stop(tmp_path):
    commands: queue.SimpleQueue = queue.SimpleQueue()
    srv = ControlServer(tmp_path / "spx.sock", lambda *a: {}, commands, queue.SimpleQueue())
    srv.start()
    replies: list[dict] = []
    client = threading.Thread(target=lambda: replies.append(request(srv.path, "cancel", "j")))
    client.start()
    cmd = commands.get(timeout=5)  # nobody plays the main loop: the cancel stays pending
    assert (cmd.op, cmd.name) == ("cancel", "j")
    srv.stop()
    client.join(timeout=5)
    assert replies and replies[0]["ok"] is False and "stopping" in replies[0]["error"]


def test_a_run_dir_others_can_write_is_replaced_before_the_socket_is_bound(tmp_path):
    """The socket's unlink, bind and chmod go by name in run_dir: a directory another uid could
    write (here: mode 0777 with a link planted at the socket's name) is moved aside, never used."""
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    victim.chmod(0o600)
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o777)
    (run / "spx.sock").symlink_to(victim)
    srv = ControlServer(run / "spx.sock", lambda *a: {"ok": True, "result": []}, queue.SimpleQueue(), queue.SimpleQueue())
    srv.start()
    try:
        assert run.is_dir() and not run.is_symlink() and (run.stat().st_mode & 0o777) == 0o755
        assert (run / "spx.sock").is_socket()
        assert victim.read_text() == "root's file\n" and (victim.stat().st_mode & 0o777) == 0o600
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".run.untrusted-")]
    finally:
        srv.stop()


def test_a_run_dir_deeper_than_sun_path_still_serves_and_answers(tmp_path):
    """sockaddr_un holds 108 bytes: a daemon under a deep --root (CI's pytest dirs reach it) binds and
    is reached through a fd of its run dir, not refused with 'AF_UNIX path too long'."""
    run = tmp_path.joinpath(*["a-fairly-long-directory-name"] * 5) / "run"
    path = run / "spx.sock"
    assert len(str(path)) >= control.SUN_PATH_BYTES
    run.parent.mkdir(parents=True)
    srv = ControlServer(path, lambda *a: {"ok": True, "result": [{"deep": True}]}, queue.SimpleQueue(), queue.SimpleQueue())
    srv.start()
    try:
        assert path.is_socket()
        assert request(path, "ls", timeout=10)["result"] == [{"deep": True}]
    finally:
        srv.stop()
