"""The whole /metrics of the fixture host against a golden file (node_exporter's end-to-end idea).

Regenerate after an intended change with `SPX_REGEN_GOLDEN=1 pytest tests/exporter/test_exporter_golden.py`
and review the diff. The clock is frozen, so the fake's counters are exact; what still varies between
runs (the worker's pid, scrape durations) is normalised.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from exporter_support import ManualClock, job_view
from metrics_text import scrape

from harness import wait_for
from spx.daemon.core.turn_times import TurnTimes
from spx.daemon.exporter.server import build_registry

GOLDEN = Path(__file__).parent / "golden" / "h100-sxm5-8.prom"


def normalise(text: str, pid: int) -> str:
    text = text.replace(f'pid="{pid}"', 'pid="<worker>"')
    return re.sub(r"^(spx_scrape_duration_seconds\{[^}]*\}) .*$", r"\1 <duration>", text, flags=re.M)


def test_golden_scrape_of_fixture_host(make_backend, worker):
    backend = make_backend(clock=ManualClock(), only_pids=[worker.pid])
    turns = TurnTimes()
    for seconds in (0.0003, 0.0004, 0.002, 0.03, 3.0):  # the main loop's turn times, as the daemon adds them
        turns.add(seconds)
    registry = build_registry(backend, lambda: [job_view(pids=[worker.pid])], "0.1.0", loop_turns=turns)
    watcher = backend.xid_watcher
    assert watcher is not None
    wait_for(lambda: watcher.counts().get((3, 79)) == 1, 10, "the fixture's XID 79 at open")
    wait_for(lambda: backend.compute_pids(0) == [worker.pid], 10, "the worker on fake GPU 0")
    text = normalise(scrape(registry), worker.pid)
    if os.environ.get("SPX_REGEN_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "scrape differs from the golden file; SPX_REGEN_GOLDEN=1 to regenerate"
