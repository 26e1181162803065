"""Two "hosts" on one machine for the tests and benchmarks of jobs across hosts: two network
namespaces joined by a veth pair, each end named IFNAME (so one job file names it for gloo) with its
own address, loopback up in each. Nothing leaves the machine; everything started in them is killed
and the namespaces (and so the veth pair) are deleted on the way out, whatever happened.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NoReturn

IFNAME = "spx0"


class NetnsUnavailable(RuntimeError):
    """This machine cannot make network namespaces (no `ip`, no privilege): benches say so; tests
    pass `unavailable=pytest.skip` to `two_hosts` and are skipped."""


@dataclass(frozen=True)
class Hosts:
    namespaces: tuple[str, str]
    addresses: tuple[str, str]


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _free_subnet() -> int:
    """X of a 10.77.X.0/24 no interface of this machine (or of a leftover namespace) uses."""
    taken = _ip("-o", "addr").stdout + "".join(_ip("-n", ns.split()[0], "-o", "addr").stdout
                                               for ns in _ip("netns", "list").stdout.splitlines() if ns.strip())
    start = os.getpid() % 250
    return next(x for x in ((start + i) % 250 + 2 for i in range(250)) if f"10.77.{x}." not in taken)


def _raise(why: str) -> NoReturn:
    raise NetnsUnavailable(why)


@contextmanager
def two_hosts(unavailable: Callable[[str], NoReturn] | None = None) -> Iterator[Hosts]:
    """Two network namespaces joined by a veth pair (10.77.X.1/24 and 10.77.X.2/24, loopback up in
    each). On the way out, whatever happened, what still runs in them is killed (only this run's
    daemons and their jobs can be there) and they are deleted, which deletes the veth pair. Where
    they cannot be made, `unavailable(why)` (a test's pytest.skip), else NetnsUnavailable."""
    unavailable = unavailable or _raise
    if shutil.which("ip") is None:
        unavailable("iproute2 (`ip`) is not installed")
    tag = uuid.uuid4().hex[:8]
    namespaces = (f"spxmn-{tag}-0", f"spxmn-{tag}-1")
    veths = (f"spxv{tag}a", f"spxv{tag}b")
    created: list[str] = []
    try:
        for ns in namespaces:
            res = _ip("netns", "add", ns)
            if res.returncode != 0:
                unavailable(f"cannot create a network namespace here: {res.stderr.strip()}")
            created.append(ns)
        x = _free_subnet()
        addresses = (f"10.77.{x}.1", f"10.77.{x}.2")
        steps = [("link", "add", veths[0], "type", "veth", "peer", "name", veths[1])]
        for ns, veth, addr in zip(namespaces, veths, addresses, strict=True):
            steps += [("link", "set", veth, "netns", ns), ("-n", ns, "link", "set", veth, "name", IFNAME),
                      ("-n", ns, "addr", "add", f"{addr}/24", "dev", IFNAME), ("-n", ns, "link", "set", IFNAME, "up"),
                      ("-n", ns, "link", "set", "lo", "up")]
        for step in steps:
            res = _ip(*step)
            assert res.returncode == 0, f"ip {' '.join(step)}: {res.stderr}"
        yield Hosts(namespaces, addresses)
    finally:
        for ns in created:
            for pid in _ip("netns", "pids", ns).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _ip("netns", "del", ns)
        _ip("link", "del", veths[0])  # only there if it was never moved into a namespace
