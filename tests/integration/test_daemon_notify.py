"""What the real daemon tells systemd, read from a $NOTIFY_SOCKET the test owns (no systemd needed;
tests/systemd/ checks the same against a real one)."""

from __future__ import annotations

import socket
import time
import urllib.request

from harness import Daemon


def _fields(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().split("\n"))


def test_ready_first_then_watchdog_and_status_then_stopping_with_extension(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(30)
    d = Daemon(tmp_path / "root", env={"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "1000000"})
    try:
        d.start()
        first = _fields(sock.recv(4096))
        assert first["READY"] == "1" and first["STATUS"] == "0 running, no GPUs (CPU jobs only)"
        assert first["MAINPID"] == str(d.proc.pid)
        # Ready means usable: the control socket answers and /metrics serves.
        assert d.ls() == []
        assert b"spx_build_info" in urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics").read()
        seen: list[dict[str, str]] = []
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            seen.append(_fields(sock.recv(4096)))
        pings = [m for m in seen if m.get("WATCHDOG") == "1"]
        assert len(pings) >= 3, f"pings every WATCHDOG_USEC/2 = 0.5 s, got {seen}"
        assert any(m.get("STATUS") == "0 running, no GPUs (CPU jobs only)" for m in seen)
        assert not any("READY" in m for m in seen), "READY=1 is sent once"
    finally:
        assert d.stop() == 0
    after = []
    sock.settimeout(0.5)
    try:
        while True:
            after.append(_fields(sock.recv(4096)))
    except TimeoutError:
        pass
    sock.close()
    stopping = [i for i, m in enumerate(after) if m.get("STOPPING") == "1"]
    extend = [i for i, m in enumerate(after) if "EXTEND_TIMEOUT_USEC" in m]
    assert stopping and extend and stopping[0] < extend[0], after
    assert after[stopping[0]]["STATUS"].startswith("stopping: 0 jobs checkpointing")
    assert int(after[extend[0]]["EXTEND_TIMEOUT_USEC"]) >= 10_000_000
