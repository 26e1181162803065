"""Test hook: kill the daemon at a chosen store write, so tests/faults can prove that a daemon dying
between any two writes of a job's life restarts into a state that runs each job as often as it should.

    SPX_TEST_FAULT_POINT=after-commit:7     # os._exit(137) right after the 7th write transaction commits
    SPX_TEST_FAULT_POINT=before-commit:7    # ... inside it, before COMMIT (SQLite rolls it back)
    SPX_TEST_FAULT_TRACE=1                  # log every write transaction (number, fault point)

Each write names its fault point (`Database.write("finish_attempt")`). They are counted per daemon
process, in the order they run (the main loop is the only writer), except the writes named None:
diagnostics whose number depends on when heartbeats land (nothing is decided on them), which would
make "the Nth write" a different write from one run to the next.
Unset — always, outside tests — `ACTIVE` is False and a write does not call in here.
"""

from __future__ import annotations

import os
import sys

from spx.daemon.core.log import get_logger

log = get_logger()
_POINT = os.environ.get("SPX_TEST_FAULT_POINT")
_TRACE = os.environ.get("SPX_TEST_FAULT_TRACE") == "1"
ACTIVE = bool(_POINT) or _TRACE
_count = 0


def begin() -> int:
    """A write transaction at a fault point begins; returns its number (1-based, per process)."""
    global _count
    _count += 1
    return _count


def reached(phase: str, number: int, op: str) -> None:
    """Die here if this is the configured point; `op` names the fault point (for the log)."""
    if _TRACE:
        log.info("test_store_write", phase=phase, number=number, op=op)
    if f"{phase}:{number}" == _POINT:
        log.warning("test_fault_point", point=_POINT, op=op)
        sys.stdout.flush()
        os._exit(137)
