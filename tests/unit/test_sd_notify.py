"""sd_notify over real AF_UNIX datagram sockets: a path socket and an abstract '@' one, as systemd
hands them out in $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from spx.daemon.service.sd_notify import Notifier


def fields(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().split("\n"))


@pytest.fixture(params=["path", "abstract"])
def listener(request, tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """(the NOTIFY_SOCKET value, the bound socket systemd would read)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.settimeout(5)
    if request.param == "path":
        address = str(tmp_path / "notify")
        s.bind(address)
    else:
        name = f"spx-test-{uuid.uuid4().hex}"
        s.bind("\0" + name)
        address = "@" + name
    yield address, s
    s.close()


def test_ready_carries_status_and_main_pid(listener):
    address, sock = listener
    Notifier(address, None).ready("0 running, 0/8 GPUs busy")
    assert fields(sock.recv(4096)) == {"READY": "1", "STATUS": "0 running, 0/8 GPUs busy", "MAINPID": str(os.getpid())}


def test_status_stopping_and_extend_timeout_are_single_datagrams(listener):
    address, sock = listener
    n = Notifier(address, None)
    n.status("1 running, 2/8 GPUs busy; llama-ft restarted 3 min ago (crash)")
    n.stopping("stopping: 1 jobs checkpointing")
    n.extend_timeout(15.0)
    assert fields(sock.recv(4096)) == {"STATUS": "1 running, 2/8 GPUs busy; llama-ft restarted 3 min ago (crash)"}
    assert fields(sock.recv(4096)) == {"STOPPING": "1", "STATUS": "stopping: 1 jobs checkpointing"}
    assert fields(sock.recv(4096)) == {"EXTEND_TIMEOUT_USEC": "15000000"}


def test_watchdog_pings_only_when_systemd_asked_for_them(listener):
    address, sock = listener
    Notifier(address, None).watchdog()  # no WatchdogSec=: nothing is sent
    Notifier(address, 4_000_000).watchdog()
    assert fields(sock.recv(4096)) == {"WATCHDOG": "1"}
    sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        sock.recv(4096)


def test_from_env_reads_socket_and_watchdog_for_this_pid(monkeypatch, tmp_path):
    monkeypatch.setenv("NOTIFY_SOCKET", "@spx-x")
    monkeypatch.setenv("WATCHDOG_USEC", "6000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    n = Notifier.from_env()
    assert n.enabled and n.address == "@spx-x"
    assert n.watchdog_interval == 3.0, "pings at half of WatchdogSec"
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # meant for another process
    assert Notifier.from_env().watchdog_interval is None
    monkeypatch.delenv("WATCHDOG_PID")
    assert Notifier.from_env().watchdog_interval == 3.0


def test_outside_systemd_every_call_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    n = Notifier.from_env()
    assert not n.enabled and n.watchdog_interval is None
    n.ready("x")
    n.status("x")
    n.watchdog()
    n.stopping("x")
    n.extend_timeout(1.0)


def test_a_vanished_socket_is_never_fatal(tmp_path):
    n = Notifier(str(tmp_path / "gone"), 2_000_000)
    n.ready("x")  # ENOENT, swallowed: systemd going away must not take the daemon down
    n.watchdog()
    abstract = Notifier(f"@spx-nobody-{uuid.uuid4().hex}", None)
    abstract.status("x")  # ECONNREFUSED, swallowed
    assert n.enabled and abstract.enabled
