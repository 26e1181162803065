"""Which GPUs may be given to an attempt, and the quarantine of those that may not.

The scheduler asks `idle(g)` before an attempt starts on a GPU (a relaunch's own GPUs included): no
compute process on it, and it passes the health gate (health.py). A GPU that fails the gate, or that
had a fatal XID while a job held it, is quarantined: recorded in the store's `gpu_quarantine` table
and never allocated again until an operator releases it (`spx gpu release N`). The XID thread only
enqueues events (`on_xid`); the main loop takes them (`faults`) and stops the attempts they hit.

Runs on the main loop (it writes the store), except `on_xid`, which is the XID thread's listener.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

from spx.daemon.core.log import get_logger
from spx.daemon.gpu.backend import GpuBackend, XidEvent
from spx.daemon.gpu.health import HealthGate, fatal_xid, xid_reason
from spx.daemon.state.db import StoreUnavailable
from spx.daemon.state.store import Store

log = get_logger()
PASS_SECONDS = 2.0  # a GPU that passed the health gate is not asked again for this long


class GpuGate:
    def __init__(self, backend: GpuBackend, store: Store, clock: Callable[[], float] = time.monotonic):
        self.backend = backend
        self.store = store
        self.clock = clock
        self.health = HealthGate(backend)
        self._passed: dict[int, float] = {}  # GPU → when it last passed the health gate (monotonic)
        self._xids: queue.SimpleQueue[XidEvent] = queue.SimpleQueue()
        # The loop's copy of the quarantine table (the loop is its writer): GPU → (uuid, reason, since).
        self.quarantined: dict[int, tuple[str | None, str, float]] = store.host.quarantined_gpus()

    def idle(self, g: int) -> bool:
        """No compute process on GPU g (from anything) and healthy; one that fails the gate is
        quarantined here, before an attempt starts on it."""
        if not self.backend.healthy(g):
            why = self.health.check(g)  # lost (off the bus, needs a reset): quarantined; else just not free
            if why is not None:
                self.quarantine(g, why)
            return False
        pids = self.backend.compute_pids(g)
        if pids is None or pids:
            return False
        now = self.clock()
        if now - self._passed.get(g, -PASS_SECONDS) < PASS_SECONDS:
            return True
        why = self.health.check(g)
        if why is not None:
            self.quarantine(g, why)
            return False
        self._passed[g] = now
        return True

    def quarantine(self, g: int, reason: str) -> None:
        """Record GPU g as faulty. A store that cannot take the write now (disk full) does not stop
        it: this daemon keeps it in memory."""
        if g in self.quarantined:
            return
        uuid = next((d.uuid for d in self.backend.devices() if d.index == g), None)
        now = time.time()
        self.quarantined[g] = (uuid, reason, now)
        log.error("gpu_quarantined", gpu=g, uuid=uuid, reason=reason)
        try:
            self.store.host.quarantine_gpu(g, uuid, reason, now)
        except StoreUnavailable as e:
            log.error("gpu_quarantine_not_stored", gpu=g, error=str(e))

    def release_text(self, gpu: str, by: str) -> dict:
        """`spx gpu release N` as asked (N as typed): the GPU may be allocated again."""
        try:
            g = int(gpu)
        except ValueError:
            return {"ok": False, "error": f"not a GPU index: {gpu!r}", "code": 2}
        return self.release(g, by)

    def release(self, g: int, by: str) -> dict:
        """`spx gpu release N` (the request table checks that `by` may): the GPU may be allocated again."""
        try:
            released = self.store.host.release_gpu(g, by, time.time())
        except StoreUnavailable as e:
            return {"ok": False, "error": f"cannot record the release now: {e}", "code": 1}
        struck = g in self.store.verifications.strikes()
        if struck:
            self.store.verifications.clear(g)  # its strikes (replays that differed) go with it
        if not released:
            if struck:
                log.info("gpu_strikes_cleared", gpu=g, by=by)
                return {"ok": True, "result": f"GPU {g}: its strikes cleared (it was not quarantined)"}
            return {"ok": False, "error": f"GPU {g} is not quarantined", "code": 1}
        self.quarantined.pop(g, None)
        self._passed.pop(g, None)
        log.info("gpu_released", gpu=g, by=by)
        return {"ok": True, "result": f"GPU {g} released"}

    def on_xid(self, event: XidEvent) -> bool:
        """The XID thread's listener: keeps a fatal XID for the loop; True when it did (wake the loop)."""
        if fatal_xid(event.xid) is None:
            return False
        self._xids.put(event)
        return True

    def faults(self, held: set[int]) -> list[tuple[int, str]]:
        """Fatal XIDs seen since the last call, on GPUs a tracked job holds: each GPU is quarantined
        and returned with what was seen, for the loop to stop the attempt on it. A fatal XID on a GPU
        no job holds is left to the gate's state checks (a GPU off the bus is lost to NVML too)."""
        hits: list[tuple[int, str]] = []
        while True:
            try:
                event = self._xids.get_nowait()
            except queue.Empty:
                return hits
            detail = xid_reason(event.gpu, event.xid)
            if event.gpu not in held:
                log.info("gpu_fatal_xid_idle", gpu=event.gpu, xid=event.xid, detail=detail)
                continue
            self.quarantine(event.gpu, detail)
            hits.append((event.gpu, detail))
