"""sd_notify: tell systemd we are ready, what we are doing, and that the main loop is alive.

The protocol is one datagram of newline-separated KEY=VALUE lines to $NOTIFY_SOCKET (a filesystem
path, or an abstract socket when it starts with '@'). Outside systemd every call is a no-op, so the
daemon runs the same by hand. No dependency: the protocol is ten lines of stdlib.
"""

from __future__ import annotations

import os
import socket
import time


class Notifier:
    def __init__(self, address: str | None, watchdog_usec: int | None):
        self.address = address
        self.enabled = bool(address)
        # Ping at half the watchdog period, as sd_watchdog_enabled(3) recommends.
        self.watchdog_interval = watchdog_usec / 2e6 if watchdog_usec else None

    @classmethod
    def from_env(cls) -> Notifier:
        address = os.environ.get("NOTIFY_SOCKET") or None
        usec = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        watchdog = int(usec) if usec and usec.isdigit() and (not pid or pid == str(os.getpid())) else None
        return cls(address, watchdog)

    def _send(self, **fields: str) -> None:
        if not self.address:
            return
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        payload = "\n".join(f"{k}={v}" for k, v in fields.items()).encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            try:
                s.sendto(payload, target)
            except OSError:
                pass  # systemd went away or the socket is gone: never fatal to the daemon

    def ready(self, status: str) -> None:
        self._send(READY="1", STATUS=status, MAINPID=str(os.getpid()))

    def reloading(self, status: str) -> None:
        """A reload begins (`systemctl reload`: the daemon re-executes itself); READY=1 from the new
        image ends it. MONOTONIC_USEC tells systemd which reload this is (it ignores it before v253)."""
        self._send(RELOADING="1", MONOTONIC_USEC=str(time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000),
                   STATUS=status)

    def status(self, text: str) -> None:
        self._send(STATUS=text)

    def watchdog(self) -> None:
        if self.watchdog_interval is not None:
            self._send(WATCHDOG="1")

    def stopping(self, status: str) -> None:
        self._send(STOPPING="1", STATUS=status)

    def extend_timeout(self, seconds: float) -> None:
        self._send(EXTEND_TIMEOUT_USEC=str(int(seconds * 1e6)))
