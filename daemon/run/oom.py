"""Did the kernel's OOM killer end this attempt? Asked of the kernel log, the only witness.

torchrun reports an OOM-killed worker as "exitcode -9", exactly like `kill -9`; the kernel log says
which it was ("Out of memory: Killed process 1234" / "oom-kill:… pid=1234"). Where /dev/kmsg is not
readable (containers), the answer is "no" and the failure is classed as a signal.
"""

from __future__ import annotations

import os
import re

_KILLED = re.compile(r"(?:Killed process|oom-kill:.*?\bpid=)\s*(\d+)")


def kernel_oom_victims(kmsg: str = "/dev/kmsg") -> set[int]:
    """Pids the OOM killer has killed, from the kernel ring buffer (read without blocking)."""
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return set()
    victims: set[int] = set()
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: a record was overwritten while reading; skip it
                continue
            if not record:
                break
            victims.update(int(m.group(1)) for m in _KILLED.finditer(record.decode("utf-8", "replace")))
    finally:
        os.close(fd)
    return victims


def oom_killed(pids: set[int], kmsg: str = "/dev/kmsg") -> bool:
    return bool(pids) and bool(pids & kernel_oom_victims(kmsg))
