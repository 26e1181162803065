"""A store with a host's history in it, written through the store's own API (bench/bench_scale.py,
tests/processes/test_scale_short.py): N finished jobs, each with 1–3 attempts, their events, phases,
progress records and backoffs as the supervisor writes them, then Q queued jobs and one "blocker"
that takes all GPUs when the daemon starts, so the queued ones really wait for GPUs.

    .venv/bin/python bench/scale_seed.py STORE --finished N --queued Q --script PATH [--gpus 8]

Times: `RECENT` finished jobs ended within the last day (what `spx ls` shows, the same at every
history size), the rest over the year before it — a history that grows in age, not in jobs per day,
so a curve against it measures the history, not a busier host. The daemon that opens the store must
keep them (config `retention.finished_jobs_days: null`), or it removes the old ones as it starts.

The rows are the API's own writes (`jobs.add`, `transition`, `attempts.start/running/finish`,
`add_phases`, `set_progress`); only the connection's `synchronous` is OFF while seeding (nothing
here needs to survive a power cut, and 100,000 jobs of fsyncs would take an hour).
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from pathlib import Path

from spx.daemon.core.spec import JobSpec
from spx.daemon.state.attempt_progress import Progress
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store

RECENT = 200            # finished jobs that ended in the last day, at every history size
DAY = 86400.0
OWNERS = ((0, "root"),)  # the daemon launches as the owner: the bench runs as root
BLOCKER = "scale-blocker"


def _spec(name: str, script: str, gpus: int, priority: int = 0) -> JobSpec:
    return JobSpec.model_validate({"name": name, "launcher": "python", "script": script, "gpus": gpus,
                                   "priority": priority})


def _accepted(jobs_dir: Path, name: str, spec: JobSpec) -> str:
    """The accepted copy intake would have written (state_dir/jobs); its path is the job's spec_file."""
    path = jobs_dir / f"{name}-{uuid.uuid4().hex[:8]}.yaml"
    path.write_text(spec.model_dump_json(by_alias=True))
    return str(path)


def finished_job(store: Store, rng: random.Random, i: int, ended: float, script: str, jobs_dir: Path) -> None:
    """One finished job's whole life, as the daemon records it: submitted, placed, 1–3 attempts
    (each started, running with phases and heartbeats, ended: restarted with a backoff, or the last
    one succeeded, failed or was cancelled)."""
    name = f"train-{i % 5000}"  # names are reused, as a host's nightly jobs are
    gpus = rng.choice((1, 2, 4, 8))
    spec = _spec(name, script, gpus)
    attempts = rng.choices((1, 2, 3), weights=(6, 3, 1))[0]
    length = rng.uniform(600, 6 * 3600)
    t = ended - length - 60 * attempts
    uid, owner = rng.choice(OWNERS)
    job = store.jobs.add(spec, uid, owner, _accepted(jobs_dir, name, spec), t)
    final = rng.choices((JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED), weights=(7, 2, 1))[0]
    step = 0
    for number in range(1, attempts + 1):
        t += rng.uniform(1, 30)
        store.jobs.transition(job, JobState.STARTING, None, t, gpus=list(range(gpus)))
        row = store.attempts.start(job, number=number, attempt_id=uuid.uuid4().hex, now=t,
                                   resumed_from=f"/ckpt/{name}/step-{step}" if step else None,
                                   resumed_from_step=step or None, port=None)
        store.attempts.running(job, row, pgid=10000 + i, boot_id="seed", start_ticks=i, reason=None, now=t + 0.2)
        store.attempts.add_phases(row, {"placed": t, "checkpoint_found": t + 0.05, "spawn": t + 0.1,
                                        "first_step": t + 3.0, "first_beat": t + 3.2})
        end = t + length / attempts
        steps = int((end - t) / 0.5)
        progress = Progress()
        for k in range(1, 6):
            at = t + 3.2 + (end - t - 4) * k / 5
            ckpt = step + steps * (k - 1) // 5
            progress = progress.seen(step + steps * k // 5, at, ckpt, at - 1, 0.5 * k, t)
        store.attempts.set_progress(row, progress.to_json())
        last = number == attempts
        state = final if last else JobState.RESTARTING
        store.attempts.finish(job, row, state, None if state is JobState.SUCCEEDED else "exit 1", end,
                              {"end": end, "exit_code": 0 if state is JobState.SUCCEEDED else 1,
                               "reason_class": None if state is JobState.SUCCEEDED else "crash",
                               "max_step": step + steps, "backoff": None if last else 5.0},
                              {"gpus": []} if last else {"backoff_level": number})
        step += steps * 4 // 5
        t = end + 5.0


def seed(path: Path, finished: int, queued: int, script: str, gpus: int = 8, seed_value: int = 29) -> dict[str, float]:
    """Write the store at `path` (made here); what was written and how long it took."""
    rng = random.Random(seed_value)
    jobs_dir = path.parent / "jobs"
    jobs_dir.mkdir(parents=True, exist_ok=True)
    store = Store(path)
    store.db.conn.execute("PRAGMA synchronous=OFF")
    start = time.monotonic()
    now = time.time()
    for i in range(finished):
        recent = i >= finished - min(RECENT, finished)
        ended = now - rng.uniform(60, DAY - 600) if recent else now - DAY - rng.uniform(0, 365 * DAY)
        finished_job(store, rng, i, ended, script, jobs_dir)
    blocker = _spec(BLOCKER, script, gpus, priority=1000)
    store.jobs.add(blocker, 0, "root", _accepted(jobs_dir, BLOCKER, blocker), now)
    for q in range(queued):
        spec = _spec(f"queued-{q}", script, rng.choice((1, 2, 4, 8)))
        store.jobs.add(spec, 0, "root", _accepted(jobs_dir, spec.name, spec), now + q * 1e-3)
    store.db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    return {"finished": finished, "queued": queued, "seed_seconds": round(time.monotonic() - start, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("store", type=Path)
    p.add_argument("--finished", type=int, required=True)
    p.add_argument("--queued", type=int, required=True)
    p.add_argument("--script", required=True)
    p.add_argument("--gpus", type=int, default=8)
    a = p.parse_args()
    print(seed(a.store, a.finished, a.queued, a.script, a.gpus))


if __name__ == "__main__":
    main()
