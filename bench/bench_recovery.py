"""Recovery after a worker failure, spx against bare torchrun, side by side in one run (issue 17's table).

    .venv/bin/python bench/bench_recovery.py [--kills 5] [--cold 3] [--quick]

One 2-worker DDP job (examples/train_ddp.py, gloo on CPU, tiny model, a checkpoint every 10 steps,
~0.1 s per step). "First step" is the worker's own record of its first optimizer step (the
`first_step` phase spx.trainer writes into its heartbeat), so every figure below ends at the same
instant, read the same way:

- bare torchrun cold start: `torchrun` launched → first step (median of --cold);
- torchrun --max-restarts=1, in-agent restart: rank 1 `kill -9`'d after step ~12; how many of K
  kills reached a first step again within 60 s, and kill → first step (median of those);
- spx cold start: the job file dropped into the spool → first step (median of --cold);
- spx relaunch: rank 1 of the running attempt `kill -9`'d, K times in one job; kill → first step of
  the next attempt (median of K), and where that time went: each phase of `spx status --timeline`
  as its delta from the kill (median of K). The next attempt's launcher is a standby, started
  ahead with torch imported (daemon/run/standby.py);
- the same relaunch by a daemon with `launch_standby: false` (every launcher starts cold), for
  what the standby saves;
- the same relaunch of a job with `restart.standby_workers: true` (its next attempt's workers started
  ahead too, daemon/run/standby_worker.py), each kill once they have their imports done, and the
  standby's memory then (`spx status`'s figure: the launcher and the workers, summed Pss);
- a plain script (`--plain`, on by default; bench/plain_ddp.py: a DDP loop on torch alone, no
  spx.trainer, no heartbeat — what most people bring), whose "first step" is the time its rank 0
  appends to a file after its first optimizer step: bare torchrun's cold start, and spx's relaunch
  (kill → first step, rank 1 `kill -9`'d once the attempt has run long enough for its next
  launcher's standby: a script without a heartbeat gets it after 20 s of work), with and without
  the standby, each on a daemon of its own with `healthy_seconds: 15` (an attempt without a heartbeat
  counts as progress once it lived that long; by default three kills within 600 s are a crash loop).

Goals (ratios of this run): spx cold start ≤ 1.05× bare torchrun's; kill → first step ≤ 1.05× the spx
cold start; with standby workers, kill → first step ≤ 0.7× bare torchrun's cold start; for the plain script, spx's kill → first step ≤ 1.0× bare torchrun's cold start. Writes bench/results/recovery.json (bench/benchlib.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import Goal, write_result  # noqa: E402
from process_tree import kill_tree, live_environments  # noqa: E402

from harness import EXAMPLES, Daemon, wait_for  # noqa: E402
from spx.daemon.state.phases import ALL_PHASES  # noqa: E402

PY = sys.executable
SCRIPT_ARGS = ["--batch_size", "4", "--model-size", "tiny", "--seed", "7", "--checkpoint-every", "10",
               "--sleep-per-step", "0.1"]
PLAIN = Path(__file__).resolve().parent / "plain_ddp.py"
KILL_AFTER_STEPS = 12      # past the first checkpoint of an attempt (every 10 steps)
PLAIN_STANDBY_AFTER = 20.0  # lifecycle/running.py STANDBY_WITHOUT_HEARTBEAT_SECONDS
PLAIN_HEALTHY_SECONDS = 15.0  # each plain attempt lives ~23 s before its kill
RECOVERY_TIMEOUT = 60.0    # a kill not followed by a first step within this is a miss


def read_beat(path: Path) -> dict | None:
    try:
        beat = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return beat if isinstance(beat, dict) else None


def first_step_after(path: Path, t: float) -> float | None:
    """The first_step phase of the heartbeat at `path`, if it is after `t` (a new attempt's)."""
    beat = read_beat(path) or {}
    fs = (beat.get("phases") or {}).get("first_step")
    return fs if isinstance(fs, float) and fs > t else None


def rank_pid(tag: str, rank: int) -> int | None:
    """The worker of global rank `rank` whose environment carries `tag` (KEY=VALUE)."""
    want = {tag.encode(), f"RANK={rank}".encode(), f"LOCAL_RANK={rank}".encode()}
    return next((pid for pid, env in live_environments() if want <= env), None)


def wait_step(path: Path, since: float, steps: int) -> None:
    """Until the heartbeat (written after `since`) shows `steps` steps past the attempt's start."""
    start: list[int] = []

    def ready() -> bool:
        beat = read_beat(path) or {}
        if not first_step_after(path, since):
            return False
        if not start:
            start.append(int(beat.get("step", 0)))
        return int(beat.get("step", 0)) >= start[0] + steps

    wait_for(ready, 120, f"{steps} steps", interval=0.05)


# --- bare torchrun --------------------------------------------------------------------------------------------


def torchrun(base: Path, name: str, max_restarts: int, steps: int) -> tuple[subprocess.Popen, Path, str]:
    run = base / name
    (run / "logs").mkdir(parents=True)
    hb = run / "heartbeat.json"
    tag = f"BENCH_RUN={name}"
    env = {**os.environ, "SPX_HEARTBEAT_FILE": str(hb), "SPX_CHECKPOINT_DIR": str(run / "ckpt"), "BENCH_RUN": name}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [PY, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2", "--master-addr=127.0.0.1",
            f"--master-port={port}", f"--max-restarts={max_restarts}", "--tee=3", f"--log-dir={run / 'logs'}",
            str(EXAMPLES / "train_ddp.py"), *SCRIPT_ARGS, "--steps", str(steps)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    return proc, hb, tag


def bare_cold(base: Path, i: int) -> tuple[float, dict[str, float]]:
    """launch → first step, and each worker phase from the launch."""
    t0 = time.time()
    proc, hb, _ = torchrun(base, f"cold{i}", 0, 10_000)
    try:
        first = wait_for(lambda: first_step_after(hb, t0), 120, "bare first step", interval=0.02) - t0
        phases = (read_beat(hb) or {}).get("phases") or {}
        return first, {k: v - t0 for k, v in phases.items()}
    finally:
        kill_tree(proc)


def bare_restart(base: Path, i: int) -> float | None:
    """kill → first step of torchrun's in-agent restart, or None if it never got there."""
    t0 = time.time()
    proc, hb, tag = torchrun(base, f"restart{i}", 1, 10_000)
    try:
        wait_step(hb, t0, KILL_AFTER_STEPS)
        pid = rank_pid(tag, 1)
        assert pid is not None, "rank 1 not found"
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        try:
            return wait_for(lambda: first_step_after(hb, killed), RECOVERY_TIMEOUT, "restart", interval=0.02) - killed
        except AssertionError:
            return None
    finally:
        kill_tree(proc)


# --- spx ---------------------------------------------------------------------------------------------------------


def job_yaml(name: str, steps: int, standby_workers: bool = False) -> str:
    argv = ", ".join(f'"{a}"' for a in [*SCRIPT_ARGS, "--steps", str(steps)])
    workers = ", standby_workers: true" if standby_workers else ""
    return (f"name: {name}\nlauncher: torchrun\nscript: {EXAMPLES / 'train_ddp.py'}\npython: {PY}\n"
            f"args: [{argv}]\nprocs: 2\nrestart: {{backoff_seconds: [0, 1], max_restarts: 100{workers}}}\n")


def standby_workers_waiting(name: str) -> list[int]:
    """The job's standby workers that have their imports done (blocked reading their command)."""
    found = []
    for pid, env in live_environments():
        try:
            if (f"SPX_JOB={name}".encode() in env and b"standby_worker.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
                    and Path(f"/proc/{pid}/syscall").read_text().startswith("0 0x0 ")):
                found.append(pid)
        except OSError:
            continue
    return found


def timeline(d: Daemon, name: str) -> list[dict]:
    return json.loads(d.spx("status", name, "--timeline", "--json").stdout)


def timeline_with(d: Daemon, name: str, attempt: int, phase: str) -> list[dict] | None:
    """The job's timeline once it has `phase` for `attempt`, else None."""
    rows = timeline(d, name)
    return rows if any(r["attempt"] == attempt and r["phase"] == phase for r in rows) else None


def spx_cold(d: Daemon, i: int) -> tuple[float, dict[str, float]]:
    """submit → first step, and each phase of attempt 1 from the submission."""
    name = f"cold{i}"
    t0 = time.time()
    d.drop(f"{name}.yaml", job_yaml(name, 3))
    # Until its first step, watch only the heartbeat file, as for bare torchrun: polling `spx ls`
    # (a Python process per look) would take CPU from the start-up being measured.
    hb = wait_for(lambda: next(iter((d.root / "run" / "jobs").glob(f"*-{name}/heartbeat.json")), None), 120,
                  "heartbeat", interval=0.02)
    wait_for(lambda: first_step_after(hb, t0), 120, "spx first step", interval=0.02)
    d.wait_state(name, {"succeeded", "failed"}, 180)
    phases = {r["phase"]: r["from_origin"] for r in timeline(d, name) if r["attempt"] == 1}
    return phases["first_step"], phases


def spx_relaunch(d: Daemon, kills: int, name: str = "relaunch", standby_workers: bool = False,
                 held: list[float] | None = None) -> tuple[list[float], dict[str, list[float]]]:
    """kill → first step per kill, and per phase its deltas from the kills. With `standby_workers`,
    each kill waits for the next attempt's 2 workers to be ready, and `held` gets the standby's
    memory (MiB) then."""
    d.drop(f"{name}.yaml", job_yaml(name, 100_000, standby_workers))
    hb = wait_for(lambda: next(iter((d.root / "run" / "jobs").glob(f"*-{name}/heartbeat.json")), None), 120, "heartbeat")
    since, kill_times = 0.0, []
    for _ in range(kills):
        wait_step(hb, since, KILL_AFTER_STEPS)
        if standby_workers:
            wait_for(lambda: len(standby_workers_waiting(name)) == 2, 120, "2 standby workers ready", interval=0.2)
            if held is not None:
                held.append((d.status(name).get("standby_memory_bytes") or 0) / 2**20)
        pid = rank_pid(f"SPX_JOB={name}", 1)
        assert pid is not None, "rank 1 not found"
        since = time.time()
        os.kill(pid, signal.SIGKILL)
        kill_times.append(since)
        wait_for(lambda s=since: first_step_after(hb, s), RECOVERY_TIMEOUT * 2, "spx relaunch first step", interval=0.05)
    # The daemon records a phase when it reads the heartbeat (once a second): the last attempt's first
    # step may be in the file before it is in the timeline.
    rows = wait_for(lambda: timeline_with(d, name, kills + 1, "first_step"), 30, "the last first step in the timeline")
    d.spx("cancel", name)
    d.wait_state(name, {"cancelled", "failed", "succeeded"}, 120)
    recover: list[float] = []
    phases: dict[str, list[float]] = {}
    for n, killed in enumerate(kill_times, start=2):
        for r in rows:
            if r["attempt"] == n:
                phases.setdefault(r["phase"], []).append(r["time"] - killed)
                if r["phase"] == "first_step":
                    recover.append(r["time"] - killed)
    return recover, phases


# --- a plain script (no heartbeat) --------------------------------------------------------------------------


def first_step_in(path: Path, after: float) -> float | None:
    """The newest first-step time bench/plain_ddp.py appended to `path`, if it is after `after`."""
    try:
        times = [float(x) for x in path.read_text().split()]
    except (OSError, ValueError):
        return None
    return max(times) if times and max(times) > after else None


def plain_bare_cold(base: Path, i: int) -> float:
    """bare torchrun launched → the plain script's first step."""
    mark = base / f"plain-cold{i}.txt"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.time()
    proc = subprocess.Popen([PY, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
                             "--master-addr=127.0.0.1", f"--master-port={port}", "--max-restarts=0", str(PLAIN),
                             "--first-step-file", str(mark)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        return wait_for(lambda: first_step_in(mark, t0), 120, "plain first step", interval=0.02) - t0
    finally:
        kill_tree(proc)


def plain_relaunch(d: Daemon, base: Path, kills: int, name: str) -> list[float]:
    """kill → first step of the next attempt, each kill once the attempt has run past its standby's start."""
    mark = base / f"{name}.txt"
    d.drop(f"{name}.yaml", f"name: {name}\nlauncher: torchrun\nscript: {PLAIN}\npython: {PY}\n"
                           f"args: [\"--first-step-file\", \"{mark}\"]\nprocs: 2\n"
                           "restart: {backoff_seconds: [0, 1], max_restarts: 100}\n")
    since, recover = 0.0, []
    for _ in range(kills):
        started = wait_for(lambda s=since: first_step_in(mark, s), 120, "plain first step", interval=0.05)
        time.sleep(max(0.0, started + PLAIN_STANDBY_AFTER + 3.0 - time.time()))  # its standby is up by then
        pid = rank_pid(f"SPX_JOB={name}", 1)
        assert pid is not None, "rank 1 not found"
        since = time.time()
        os.kill(pid, signal.SIGKILL)
        recover.append(wait_for(lambda s=since: first_step_in(mark, s), RECOVERY_TIMEOUT * 2, "plain relaunch",
                                interval=0.02) - since)
    d.spx("cancel", name)
    d.wait_state(name, {"cancelled", "failed", "succeeded"}, 120)
    return recover


def plain_cases(base: Path, kills: int, colds: int) -> tuple[list[float], list[float], list[float]]:
    """Bare torchrun's cold starts, then spx's relaunches with and without the standby. The daemons
    count an attempt alive PLAIN_HEALTHY_SECONDS as progress: the script writes none the daemon could
    see, and three kills within the default 600 s would end it as a crash loop."""
    bare = [plain_bare_cold(base, i) for i in range(colds)]
    relaunched = {}
    for name, standby in (("plain", True), ("plain-no-standby", False)):
        d = Daemon(base / f"spx-{name}", config={"healthy_seconds": PLAIN_HEALTHY_SECONDS, "launch_standby": standby})
        d.start()
        try:
            relaunched[name] = plain_relaunch(d, base, kills, name)
        finally:
            d.stop()
    return bare, relaunched["plain"], relaunched["plain-no-standby"]


def med(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 2) if xs else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=5, help="kills per restart figure (K)")
    ap.add_argument("--cold", type=int, default=3, help="cold starts per cold-start figure")
    ap.add_argument("--quick", action="store_true", help="2 kills, 1 cold start each")
    ap.add_argument("--no-plain", dest="plain", action="store_false", help="leave out the plain script's case")
    a = ap.parse_args()
    kills, colds = (2, 1) if a.quick else (a.kills, a.cold)
    with tempfile.TemporaryDirectory(prefix="spx-bench-recovery-") as tmp:
        base = Path(tmp)
        d = Daemon(base / "spx")
        d.start()
        try:
            bare_runs, cold_runs = [], []
            for i in range(colds):  # interleaved: a busy spell of this shared machine hits both alike
                bare_runs.append(bare_cold(base, i))
                cold_runs.append(spx_cold(d, i))
            restarts = [bare_restart(base, i) for i in range(kills)]
            relaunch, phases = spx_relaunch(d, kills)
        finally:
            d.stop()
        held: list[float] = []
        d = Daemon(base / "spx-standby-workers")
        d.start()
        try:
            relaunch_workers, phases_workers = spx_relaunch(d, kills, "relaunch-workers", True, held)
        finally:
            d.stop()
        d = Daemon(base / "spx-no-standby", config={"launch_standby": False})
        d.start()
        try:
            relaunch_cold, _ = spx_relaunch(d, kills, "relaunch-cold")
        finally:
            d.stop()
        plain_bare, plain, plain_cold = plain_cases(base, kills, colds) if a.plain else ([], [], [])
    bare, cold = [b for b, _ in bare_runs], [c for c, _ in cold_runs]
    ok = [r for r in restarts if r is not None]
    bare_m, cold_m, relaunch_m = med(bare), med(cold), med(relaunch)
    rows = [
        {"case": "bare torchrun cold start (launch → first step)", "median_s": bare_m, "n": len(bare)},
        {"case": "torchrun --max-restarts=1 in-agent restart (kill → first step)", "median_s": med(ok),
         "reached": f"{len(ok)} of {len(restarts)}"},
        *({"case": f"  bare torchrun cold phase {p} (from launch)", "median_s": med([r[p] for _, r in bare_runs if p in r])}
          for p in sorted(bare_runs[0][1], key=ALL_PHASES.index)),
        {"case": "spx cold start (submit → first step)", "median_s": cold_m, "n": len(cold)},
        *({"case": f"  spx cold phase {p} (from submit)", "median_s": med([r[p] for _, r in cold_runs if p in r])}
          for p in sorted(cold_runs[0][1], key=ALL_PHASES.index)),
        {"case": "spx relaunch (kill → first step)", "median_s": relaunch_m, "reached": f"{len(relaunch)} of {kills}"},
        *({"case": f"  spx relaunch phase {p} (from the kill)", "median_s": med(v)} for p, v in phases.items()),
        {"case": "spx relaunch without a standby (launch_standby: false)", "median_s": med(relaunch_cold),
         "reached": f"{len(relaunch_cold)} of {kills}"},
        {"case": "spx relaunch with standby workers (restart.standby_workers)", "median_s": med(relaunch_workers),
         "reached": f"{len(relaunch_workers)} of {kills}", "runs_s": [round(x, 2) for x in relaunch_workers]},
        *({"case": f"  standby workers relaunch phase {p} (from the kill)", "median_s": med(v)}
          for p, v in phases_workers.items()),
        {"case": "  standby with 2 workers ready: memory (MiB, summed Pss, at each kill)", "median_s": None,
         "median_mib": round(statistics.median(held)) if held else None, "runs_mib": [round(x) for x in held]},
    ]
    if a.plain:
        rows += [
            {"case": "plain script: bare torchrun cold start (launch → first step)", "median_s": med(plain_bare),
             "n": len(plain_bare), "runs_s": [round(x, 2) for x in plain_bare]},
            {"case": "plain script: spx relaunch (kill → first step)", "median_s": med(plain),
             "reached": f"{len(plain)} of {kills}", "runs_s": [round(x, 2) for x in plain]},
            {"case": "plain script: spx relaunch without a standby", "median_s": med(plain_cold),
             "reached": f"{len(plain_cold)} of {kills}", "runs_s": [round(x, 2) for x in plain_cold]},
        ]
    goals = [Goal("spx cold start / bare torchrun cold start", round((cold_m or 0) / (bare_m or 1), 3), "<=", 1.05),
             Goal("spx kill → first step / spx cold start", round((relaunch_m or 0) / (cold_m or 1), 3), "<=", 1.05)]
    goals.append(Goal("spx kill → first step with standby workers / bare torchrun cold start",
                      round((med(relaunch_workers) or 0) / (bare_m or 1), 3), "<=", 0.7))
    if a.plain:
        goals.append(Goal("plain script: spx kill → first step / bare torchrun cold start",
                          round((med(plain) or 0) / (med(plain_bare) or 1), 3), "<=", 1.0))
    path = write_result("recovery", rows, goals)
    for r in rows:
        extra = r.get("reached") or (f"n={r['n']}" if "n" in r else "") or (
            f"{r['median_mib']} MiB {r['runs_mib']}" if "median_mib" in r else "")
        print(f"{r['case']:<66} {r['median_s'] if r['median_s'] is not None else '-':>7} s  {extra}")
    for g in goals:
        print(f"goal {g.name}: {g.value} {g.op} {g.target}: {'met' if g.met else 'NOT met'}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
