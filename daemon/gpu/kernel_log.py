"""The kernel's own lines about a GPU (NVIDIA's driver: `NVRM: Xid (PCI:0000:18:00): 79, …`, ECC and
row-remapping reports) within a time window, read from `/dev/kmsg` as root: what an operator hands
a hardware vendor with an incident.

The driver names a GPU by its PCI address, which NVML gives as `00000000:18:00.0`; the kernel
writes `PCI:0000:18:00`. `/dev/kmsg` gives one record per read, `PRIORITY,SEQ,MICROSECONDS,FLAGS;TEXT`,
the time in microseconds of the kernel's monotonic clock (continuation lines begin with a space
and are skipped); the window is given in wall time and shifted by this process's wall − monotonic.

Bounded: at most `MAX_SCAN_BYTES` read (the kernel's ring is smaller), `MAX_LINES` lines per GPU of
at most `MAX_LINE_CHARS` each; never blocks (O_NONBLOCK: the end of the ring is EAGAIN). Where
/dev/kmsg is not readable (a container, not root) the answer is empty and says why. Called off the
main loop (run/incidents.py).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field

KMSG = "/dev/kmsg"
MAX_SCAN_BYTES = 8 * 1024 * 1024
MAX_LINES = 20
MAX_LINE_CHARS = 300
SLACK_SECONDS = 2.0  # either side of the window: the clocks are compared, not synchronised
_PCI = re.compile(r"PCI:([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})")
_ABOUT_GPU_HEALTH = re.compile(r"\bXid\b|\bECC\b|fallen off the bus|row remap|uncorrectable|\bDBE\b|\bSBE\b",
                               re.IGNORECASE)


def kernel_address(nvml_bus_id: str) -> str | None:
    """`00000000:18:00.0` (NVML) → `0000:18:00` (as the driver writes it after `PCI:`); None if odd."""
    m = re.fullmatch(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?", nvml_bus_id.strip())
    if m is None:
        return None
    return f"{m.group(1)[-4:]}:{m.group(2)}:{m.group(3)}".lower()


@dataclass
class KernelLines:
    """What the kernel said about each GPU (by kernel address) in the window, and why nothing, if so."""

    lines: dict[str, list[str]] = field(default_factory=dict)
    unavailable: str | None = None  # e.g. "/dev/kmsg: Permission denied"
    truncated: bool = False         # the scan or a GPU's lines hit their bound


def gpu_lines(addresses: set[str], start_wall: float, end_wall: float, path: str = KMSG,
              wall_minus_monotonic: float | None = None) -> KernelLines:
    """The kernel's health lines about the GPUs at `addresses` (kernel_address form) between
    `start_wall` and `end_wall` (Unix seconds), bounded (module doc)."""
    out = KernelLines({a: [] for a in addresses})
    offset = time.time() - time.monotonic() if wall_minus_monotonic is None else wall_minus_monotonic
    low_us = (start_wall - offset - SLACK_SECONDS) * 1e6
    high_us = (end_wall - offset + SLACK_SECONDS) * 1e6
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as e:
        out.unavailable = f"{path}: {e.strerror or e}"
        return out
    scanned = 0
    pending = b""
    try:
        while scanned < MAX_SCAN_BYTES:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: a record was overwritten while reading; go on with the next
                continue
            if not chunk:
                break
            scanned += len(chunk)
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for raw in complete:
                _take(out, raw.decode("utf-8", "replace"), low_us, high_us)
        else:
            out.truncated = True
    finally:
        os.close(fd)
    return out


def _take(out: KernelLines, line: str, low_us: float, high_us: float) -> None:
    """Keep one record if it is about a wanted GPU's health and in the window."""
    if not line or line[0] == " " or ";" not in line:
        return
    head, text = line.split(";", 1)
    parts = head.split(",")
    try:
        micros = float(parts[2])
    except (IndexError, ValueError):
        return
    if not low_us <= micros <= high_us or not _ABOUT_GPU_HEALTH.search(text):
        return
    m = _PCI.search(text)
    if m is None:
        return
    address = f"{m.group(1)}:{m.group(2)}:{m.group(3)}".lower()
    kept = out.lines.get(address)
    if kept is None:
        return
    if len(kept) >= MAX_LINES:
        out.truncated = True
        return
    kept.append(text[:MAX_LINE_CHARS])
