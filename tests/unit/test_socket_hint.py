"""`spx` with no daemon on its socket: a daemon socket found under the current directory is suggested
only when no one but the caller or root controls it, and an untrusted one is never connected to; the
client caps what it reads from any socket."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from spx.daemon.cli import socket_hint
from spx.daemon.core.config import DaemonConfig
from spx.daemon.service import control

NOBODY = 65534
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the directories to another user")


def listening(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(8)
    return s


@pytest.fixture
def planted(tmp_path) -> Iterator[tuple[Path, socket.socket]]:
    """tmp_path/x/run/spx.sock: a listening socket nobody accepts on (a connection would queue)."""
    run = tmp_path / "x" / "run"
    run.mkdir(parents=True, mode=0o755)
    (tmp_path / "x").chmod(0o755)
    run.chmod(0o755)
    s = listening(run / "spx.sock")
    s.setblocking(False)
    yield tmp_path, s
    s.close()


def cfg(tmp_path: Path) -> DaemonConfig:
    return DaemonConfig.rooted(tmp_path / "no-daemon-here")


def never_connected(s: socket.socket) -> bool:
    try:
        conn, _ = s.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


def answer_once(s: socket.socket, reply: bytes) -> threading.Thread:
    def serve() -> None:
        conn, _ = s.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(reply)

    s.setblocking(True)
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def test_a_trusted_socket_that_answers_is_suggested(planted):
    tmp_path, s = planted
    served = answer_once(s, b'{"ok": true, "result": []}\n')
    message = socket_hint.not_running_message(cfg(tmp_path), tmp_path)
    served.join(timeout=10)
    assert f"one does on {tmp_path}/x/run/spx.sock" in message
    assert f"spx --root {tmp_path}/x" in message and "not asked" not in message


@AS_ROOT
@pytest.mark.parametrize("foreign", ["x", "x/run", "x/run/spx.sock"])
def test_a_socket_another_user_controls_is_never_connected_to(planted, foreign):
    tmp_path, s = planted
    os.chown(tmp_path / foreign, NOBODY, NOBODY, follow_symlinks=False)
    message = socket_hint.not_running_message(cfg(tmp_path), tmp_path)
    assert never_connected(s), "spx connected to a socket another user controls"
    assert f"not asked: {tmp_path}/x/run/spx.sock (not root's" in message
    assert "the daemon is not running" in message


@pytest.mark.parametrize("how", ["group-writable run dir", "world-writable x", "x is a link"])
def test_a_socket_in_a_directory_others_can_change_is_never_connected_to(planted, how):
    tmp_path, s = planted
    cwd = tmp_path
    if how == "group-writable run dir":
        (tmp_path / "x" / "run").chmod(0o775)
    elif how == "world-writable x":
        (tmp_path / "x").chmod(0o1777)
    else:  # a link in the directory spx runs in, to a daemon root elsewhere
        cwd = tmp_path / "cwd"
        cwd.mkdir()
        (cwd / "x").symlink_to(tmp_path / "x")
    message = socket_hint.not_running_message(cfg(tmp_path), cwd)
    assert never_connected(s)
    assert f"not asked: {cwd}/x/run/spx.sock" in message


def test_the_trusted_run_dir_is_reached_by_its_fd(planted):
    tmp_path, s = planted
    cwd_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        run_fd = socket_hint.open_trusted_run_dir(cwd_fd, "x")
        assert run_fd is not None
        try:
            (tmp_path / "x").rename(tmp_path / "moved")  # a swap after the check changes nothing
            served = answer_once(s, b'{"ok": true, "result": ["same"]}\n')
            reply = control.request(Path(f"/proc/self/fd/{run_fd}/spx.sock"), "ls", timeout=5)
            served.join(timeout=10)
        finally:
            os.close(run_fd)
        assert reply == {"ok": True, "result": ["same"]}
        assert socket_hint.open_trusted_run_dir(cwd_fd, "no-such-dir") is None
    finally:
        os.close(cwd_fd)


def test_a_reply_larger_than_the_cap_is_cut_off_with_an_error(tmp_path):
    srv = listening(tmp_path / "spx.sock")
    stop = threading.Event()

    def flood() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(65536)
            try:
                while not stop.is_set():
                    conn.sendall(b"x" * (1 << 20))  # never a newline
            except OSError:  # the client closed: it stopped reading
                pass

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    try:
        reply = control.request(tmp_path / "spx.sock", "ls", timeout=30)
    finally:
        stop.set()
        t.join(timeout=10)
        srv.close()
    assert reply["ok"] is False and f"larger than {control.MAX_REPLY >> 20} MiB" in reply["error"]


def test_a_server_that_never_answers_costs_the_whole_deadline_once(tmp_path):
    srv = listening(tmp_path / "spx.sock")
    with srv, pytest.raises(TimeoutError, match="no whole reply .* within 0.2 s"):
        control.request(tmp_path / "spx.sock", "ls", timeout=0.2)
