"""Slow ranks explained in the job views every reader shares (`spx status`, `spx top`, /metrics).

A view of a running job carries its heartbeat's per-rank step times; here the slowest rank, when it
is `threshold_percent` above the median, is joined with its GPU's evidence from the board the
exporter's scrapes fill (gpu/evidence.py, gpu/straggler.py) and, where the GPU shows no cause,
with its process's run-queue wait (run/rank_cpu.py). A job without rank times (a script
that does not use spx.trainer) gets its throttled GPUs instead; one whose first window of rank times
is not over yet (an empty list) gets nothing until they come, so its first finding names the rank.
Each new finding is logged once.
"""

from __future__ import annotations

import threading
from dataclasses import replace

from spx.daemon.core.log import get_logger
from spx.daemon.gpu.evidence import EvidenceBoard
from spx.daemon.gpu.straggler import Straggler, explain, rank_gpu, slow_rank, throttled_gpus
from spx.daemon.run.rank_cpu import RunQueueWait
from spx.daemon.state.views import JobView

log = get_logger()


class StragglerWatch:
    """Annotates views with `stragglers`; `board` None (no GPU backend): rank times only."""

    def __init__(self, board: EvidenceBoard | None, threshold_percent: float) -> None:
        self.board = board
        self.threshold_percent = threshold_percent
        self._said: dict[str, tuple] = {}
        self.cpu = RunQueueWait()
        self._lock = threading.Lock()

    def annotate(self, views: list[JobView]) -> list[JobView]:
        """Every view explained; what is kept of processes that ended is dropped."""
        self.cpu.forget({pid for v in views for pid in v.pids})
        return [self.view(v) for v in views]

    def view(self, v: JobView) -> JobView:
        found = self.find(v) if v.state == "running" else []
        self._log(v, found)
        return replace(v, stragglers=[s.to_json() for s in found]) if found else v

    def find(self, v: JobView) -> list[Straggler]:
        board = self.board
        slow = slow_rank(v.rank_step_seconds, self.threshold_percent)
        if slow is not None:
            gpu = rank_gpu(slow.rank, v.gpus, v.node.ranks if v.node is not None else None)
            now, before = board.latest(gpu) if board is not None and gpu is not None else (None, None)
            pid = self.cpu.rank_pid(v.pids, slow.rank)
            return [explain(slow, gpu, now, before, self.cpu.waiting_share(pid) if pid is not None else None)]
        if v.rank_step_seconds is None and v.gpus and board is not None:
            return throttled_gpus(v.gpus, {g: board.latest(g) for g in v.gpus})
        return []

    def _log(self, v: JobView, found: list[Straggler]) -> None:
        """Once per job and finding (rank, GPU, cause): a new one, or its end."""
        key = tuple((s.rank, s.gpu, s.cause) for s in found)
        with self._lock:
            before = self._said.get(v.name, ())
            if key == before:
                return
            if key:
                self._said[v.name] = key
            else:
                self._said.pop(v.name, None)
        if found:
            for s in found:
                log.warning("straggler_found", job=v.name, attempt=v.attempts, rank=s.rank, gpu=s.gpu,
                            cause=s.cause, slower=s.slower, detail=s.text)
        else:
            log.info("straggler_gone", job=v.name, attempt=v.attempts)
