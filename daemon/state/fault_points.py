"""Test hook: kill the daemon at a chosen store write, so tests/faults can prove that a daemon dying
between any two writes of a job's life restarts into a state that runs each job as often as it should.

    SPX_TEST_FAULT_POINT=after-commit:7     # os._exit(137) right after the 7th write transaction commits
    SPX_TEST_FAULT_POINT=before-commit:7    # ... inside it, before COMMIT (SQLite rolls it back)
    SPX_TEST_FAULT_TRACE=1                  # log every write transaction (number, store method)

Counted per daemon process, in the order `Store._tx` runs them (the main loop is the only writer),
except the writes in NOT_COUNTED: diagnostics whose number depends on when heartbeats land (nothing is
decided on them), which would make "the Nth write" a different write from one run to the next.
Unset — always, outside tests — every call is one dictionary lookup that finds nothing.
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
NOT_COUNTED = frozenset({"add_attempt_phases"})


def begin(op: str) -> int | None:
    """A write transaction of store method `op` begins; returns its number (1-based, per process),
    None for a write that is not counted."""
    global _count
    if op in NOT_COUNTED:
        return None
    _count += 1
    return _count


def reached(phase: str, number: int | None, op: str) -> None:
    """Die here if this is the configured point; `op` names the store method (for the log)."""
    if number is None:
        return
    if _TRACE:
        log.info("test_store_write", phase=phase, number=number, op=op)
    if f"{phase}:{number}" == _POINT:
        log.warning("test_fault_point", point=_POINT, op=op)
        sys.stdout.flush()
        os._exit(137)
