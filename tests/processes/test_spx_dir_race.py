"""The `.spx/` lease (userfs/spx_dir.py) raced for by real processes, started together at a barrier:
a free lease, and an expired one, is taken by exactly one of them. The lease's rules without
processes: tests/unit/test_spx_dir.py."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

from spx.daemon.userfs import spx_dir

UID = "0123456789abcdef0123456789abcdef"
RACERS = 8
ROUNDS = 6


def _ckpt(tmp_path: Path, uid: str = UID) -> Path:
    ckpt = tmp_path / "ckpt"
    (ckpt / ".spx").mkdir(parents=True, exist_ok=True)
    (ckpt / ".spx" / "job.yaml").write_text(f'# record\nuid: "{uid}"\nformat: 1\n')
    return ckpt


def _lease(host: str, expires_in: float = 60.0) -> dict:
    now = time.time()
    return {"host": host, "job": UID, "expires": now + expires_in, "written": now}


def _racer(ckpt: str, host: str, barrier, results) -> None:
    barrier.wait()
    reply = spx_dir.claim({"dir": ckpt, "lease": _lease(host), "now": time.time()})
    results.put((host, reply["held"]))


def _race(ckpt: Path) -> list[str]:
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(RACERS), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(str(ckpt), f"host-{i}", barrier, results)) for i in range(RACERS)]
    for p in procs:
        p.start()
    got = [results.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(30)
    return [host for host, held in got if held]


def test_racing_daemons_take_a_free_lease_exactly_once(tmp_path):
    ckpt = _ckpt(tmp_path)
    for _ in range(ROUNDS):
        (ckpt / ".spx" / "lease").unlink(missing_ok=True)
        winners = _race(ckpt)
        assert len(winners) == 1, winners
        assert json.loads((ckpt / ".spx" / "lease").read_text())["host"] == winners[0]


def test_racing_daemons_break_an_expired_lease_exactly_once(tmp_path):
    ckpt = _ckpt(tmp_path)
    for _ in range(ROUNDS):
        (ckpt / ".spx" / "lease").write_text(json.dumps(_lease("lost-host", expires_in=-1)))
        winners = _race(ckpt)
        assert len(winners) == 1, winners
        assert json.loads((ckpt / ".spx" / "lease").read_text())["host"] == winners[0]
    assert sorted(os.listdir(ckpt / ".spx")) == ["job.yaml", "lease", "lease.lock"], "no temporary or aside file is left"
