"""Lease race: 8 daemons' helpers (real processes, real flock on one directory) break one expired
`.spx/lease` at the same moment, 200 rounds: each round exactly one holds it, under a generation
one past the round before, and nothing is left behind. (Before the compare-and-swap under flock,
three or more breakers could leave two holders.)"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

from spx.daemon.userfs import spx_dir

UID = "0123456789abcdef0123456789abcdef"
RACERS = 8
ROUNDS = 200
WAIT = 30.0


def _lease(host: str, expires_in: float) -> dict:
    now = time.time()
    return {"host": host, "label": host, "job": UID, "expires": now + expires_in, "written": now}


def _racer(ckpt: str, host: str, start, results) -> None:
    """One daemon's helper: every round, at the barrier, try to take the (expired) lease."""
    for _ in range(ROUNDS):
        start.wait(WAIT)
        reply = spx_dir.claim({"dir": ckpt, "lease": _lease(host, 60.0), "now": time.time()})
        results.put((host, reply["held"], reply.get("gen")))


def test_eight_processes_breaking_one_expired_lease_leave_one_holder_each_round(tmp_path: Path):
    ckpt = tmp_path / "ckpt"
    (ckpt / ".spx").mkdir(parents=True, mode=0o700)
    (ckpt / ".spx" / "job.yaml").write_text(f'# record\nuid: "{UID}"\nformat: 1\n')
    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Barrier(RACERS + 1), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(str(ckpt), f"host-{i}", start, results)) for i in range(RACERS)]
    for p in procs:
        p.start()
    started = time.monotonic()
    try:
        last_gen = 0
        for n in range(ROUNDS):
            lease = ckpt / ".spx" / "lease"
            if lease.exists():  # the last round's holder is lost: its lease has expired
                doc = json.loads(lease.read_text())
                lease.write_text(json.dumps({**doc, "expires": time.time() - 1}))
            start.wait(WAIT)
            got = [results.get(timeout=WAIT) for _ in procs]
            winners = [(host, gen) for host, held, gen in got if held]
            assert len(winners) == 1, f"round {n}: {winners}"
            host, gen = winners[0]
            assert gen == last_gen + 1, f"round {n}: generation {gen} after {last_gen}"
            on_disk = json.loads(lease.read_text())
            assert (on_disk["host"], on_disk["gen"]) == (host, gen)
            last_gen = gen
    finally:
        for p in procs:
            p.join(WAIT)
            if p.is_alive():
                p.kill()
    elapsed = time.monotonic() - started
    assert sorted(os.listdir(ckpt / ".spx")) == ["job.yaml", "lease", "lease.lock"], "no temporary file is left"
    print(f"lease race: {ROUNDS} rounds of {RACERS} breakers, one holder each, in {elapsed:.1f} s")
