"""Goodput under failures: the same fixed training undisturbed, with a worker `kill -9`'d every T
seconds, and once reclaimed like a spot host (SIGTERM), under spx-trainer and under bare
`torchrun --max-restarts=K`, in one run.

    .venv/bin/python bench/bench_goodput.py [--quick] [--steps N] [--intervals 60 20] [--seed 1 | --seeds 1 2 3]
    .venv/bin/python bench/bench_goodput.py --ledger-check [--steps 800]   # the goodput ledger's checks
    .venv/bin/python bench/bench_goodput.py --launchers spx torchrun …   # a subset of the launchers: spx,
                      spx-standby-workers (the opt-in restart.standby_workers, daemon/run/standby_worker.py), torchrun

The work: examples/train_ddp.py, 2 ranks, gloo on CPU, tiny model, `--sleep-per-step 0.1`, a
checkpoint every 100 steps (what a user sets: a few seconds of work per checkpoint, not every step),
training seed 7. 1200 steps take ~2.5 min undisturbed on a 2-core machine (`--quick`: 500 steps,
T = 60 s only). Each launcher runs:

- undisturbed: its wall time is the floor (spx: first attempt's start → last attempt's end, from
  `spx status`; torchrun: the launcher's start → exit, relaunches included);
- kill -9 every T s: at T, 2T, … after the start a rank drawn from `random.Random(seed)` (the
  schedule is printed) is SIGKILLed; when that rank has no live worker (between attempts) the kill
  hits nothing and is recorded as skipped. With `--seeds`, the runs at the shortest T are made once
  per seed (another draw of the ranks each time, rank 0 included) and the table gives their median
  with the spread; each row has its steps recomputed per kill;
- spot reclaim: at half the undisturbed wall time, SIGTERM to the launcher's process group (torchrun
  and its workers), as a cloud's shutdown delivers it to every process. The workers checkpoint and
  exit 75. Under spx the daemon sees a "preempted" attempt and relaunches it at once (on a real
  reclaim the host goes; the replacement host resumes from the same volume: docs/host-loss.md).
  Bare torchrun just exits; the bench relaunches the same command at once (a user's retry loop, or
  the replacement host's start), which flatters torchrun: no human delay is charged.

spx jobs use `restart: {max_restarts: K, backoff_seconds: [0, 1]}` and torchrun `--max-restarts=K`
(K = 100 by default, so neither runs out of restarts). A miss is a kill after which training never
reached a step again before the next kill that hit a worker, or within --stall-timeout seconds (so
when T is near the restart time, a restart killed before its first step counts too). A torchrun
stuck that long is killed (its whole group) and relaunched, as a user's watchdog would; an spx stall
is left to the daemon's hang detection. A run that ends without finishing the work (torchrun exiting
non-zero; an spx job failed, e.g. by its crash-loop guard) is relaunched / submitted again over the
same checkpoints and counted as an unfinished run; its wall time runs on. A run not done after
--give-up (4) × its undisturbed wall time is stopped: not finished, goodput 0 (when restarts take
longer than T, every kill lands in a restart and no work gets done).

Goodput = undisturbed wall / disturbed wall of the same launcher (the cost of the failures), and
also against bare torchrun's undisturbed wall. Steps computed vs useful come from rank 0's
heartbeat (written at most once a second, so the recomputed steps are a lower bound off by at most a
second of steps per kill): every drop of the step counter is work done again. Each spx row also lists
its relaunches (`relaunches`): the step each resumed from and, for one that did not resume from a
just-in-time checkpoint of the attempt before, that attempt's lines about its survivors and its
teardown — the bench's work directory goes at its end, so a kill that cost steps is explained there.
Goals: spx goodput ≥ 0.95 at T = 60 s (issue 17) and ≥ 0.9 at T = 20 s (issue 29: the median over
the seeds), the latter also for spx with standby workers (`spx-standby-workers`, opt-in per job).

The daemon's own account (issue 27): each spx run also records its goodput ledger (`spx status
--json`'s `ledger`): `ledger_goodput` (productive over the job's time holding GPUs), `recomputed_s`
and how far the ledger's settled + unsettled seconds are from the job's wall time (`ledger_sum_error`,
a fraction). Against it, the bench's own measure from rank 0's heartbeat, as the bench samples it
(`external_goodput`): per attempt (told apart by the heartbeat's phases), the time from its first beat
to where it reached the step the next attempt resumed from (the next one's first step - 1,
interpolated between samples; the last attempt: its last step), summed, over the run's wall time.
The ledger's goodput is the kept training time, not the ratio to the undisturbed run (which also
charges the relaunch's start-up to the failure), so the two goodputs measure different things. The
kill -9 runs at the shortest T are run twice under spx: with the trainer's JIT checkpoints (a surviving
rank saves the last step: nothing recomputed) and without (`--no-jit-checkpoint`: resumes from the
last periodic checkpoint, recomputing). `--ledger-check` runs only those two (spx at T = 20 s).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import daemon_query  # noqa: E402
from benchlib import Goal, write_result  # noqa: E402
from process_tree import kill_tree  # noqa: E402

from harness import EXAMPLES, Daemon  # noqa: E402
from spx.daemon.contract.worker_env import ENV_HEARTBEAT_FILE  # noqa: E402
from spx.daemon.run.launcher import free_port  # noqa: E402

PY = sys.executable
SCRIPT = EXAMPLES / "train_ddp.py"
PROCS = 2
CHECKPOINT_EVERY = 100
TRAIN_SEED = 7


def train_args(steps: int, jit: bool = True) -> list[str]:
    return ["--batch_size", "4", "--model-size", "tiny", "--seed", str(TRAIN_SEED), "--steps", str(steps),
            "--checkpoint-every", str(CHECKPOINT_EVERY), "--sleep-per-step", "0.1",
            *([] if jit else ["--no-jit-checkpoint"])]


# -- the processes of one run, found from /proc -----------------------------------------------------


def _proc_env(pid: str) -> tuple[list[bytes], str, str] | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, IndexError):
        return None
    return env, state, cmdline


def tagged(tag: str) -> list[tuple[int, list[bytes], str]]:
    """Live processes whose environment holds `tag` (KEY=VALUE): (pid, environ, cmdline)."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        info = _proc_env(entry.name)
        if info is not None and tag.encode() in info[0] and info[1] not in ("Z", "X"):
            out.append((int(entry.name), info[0], info[2]))
    return out


def run_tag(work: Path) -> str:
    """NAME=VALUE in the environment of every process of the run in `work`: unique to this bench's
    run (its temporary directory's name too), so that a run left over from another bench — killed
    half-way, its workers still up — is never taken for this one's (its heartbeat, its ranks)."""
    return f"GOODPUT_RUN={work.parent.name}-{work.name}"


def worker_pids(tag: str) -> dict[int, int]:
    """{rank: pid} of the training workers (torchrun sets RANK in each worker's environment)."""
    ranks = {}
    for pid, env, cmdline in tagged(tag):
        rank = next((e[5:] for e in env if e.startswith(b"RANK=")), None)
        if rank is not None and SCRIPT.name in cmdline:
            ranks[int(rank)] = pid
    return ranks


def launcher_pgid(tag: str) -> int | None:
    """The process group of the job's torchrun agent (it and its workers)."""
    for pid, env, cmdline in tagged(tag):
        is_agent = "torch.distributed.run" in cmdline or "torchrun" in cmdline
        if is_agent and not any(e.startswith(b"RANK=") for e in env):
            try:
                return os.getpgid(pid)
            except ProcessLookupError:
                continue
    return None


# -- rank 0's heartbeat: steps computed ------------------------------------------------------------


@dataclass
class StepLog:
    """Samples of rank 0's heartbeat file: (time, step, status), one per distinct write; and `beats`:
    (the beat's own time, step, its attempt: the time its worker's interpreter came up)."""

    samples: list[tuple[float, int, str]] = field(default_factory=list)
    beats: list[tuple[float, int, float | None]] = field(default_factory=list)

    def last_step(self) -> int:
        return self.samples[-1][1] if self.samples else 0

    def running_since(self, t: float) -> bool:
        return any(ts > t and status == "running" for ts, _, status in self.samples)

    def computed(self) -> int:
        """Steps computed: the final step plus, at each drop of the counter, the steps done again."""
        total, prev = 0, 0
        for _, step, _ in self.samples:
            if step < prev:
                total += prev - step + 1  # resumed from step-1: steps step..prev are recomputed
            prev = step
        return total + prev

    def kept_training_seconds(self) -> float:
        """Training time whose steps were kept: per attempt, its first beat → where it reached the
        step the next attempt resumed from (the next one's first step - 1; interpolated between
        beats), all of it for the last attempt."""
        attempts: list[list[tuple[float, int]]] = []
        key: object = object()
        for t, step, attempt in self.beats:
            if attempt != key or not attempts:
                attempts.append([])
                key = attempt
            attempts[-1].append((t, step))
        kept = 0.0
        for i, beats in enumerate(attempts):
            resumed = attempts[i + 1][0][1] - 1 if i + 1 < len(attempts) else beats[-1][1]
            kept += reached(beats, resumed) - beats[0][0]
        return kept


    def series(self, start: float, most: int = 400) -> list[list[float]]:
        """[seconds since `start`, step] per sample, for bench/figures.py's step-over-time picture:
        every drop of the counter and its neighbours kept, other samples thinned to about `most`."""
        if not self.samples:
            return []
        keep = {0, len(self.samples) - 1}
        for i in range(1, len(self.samples)):
            if self.samples[i][1] < self.samples[i - 1][1]:
                keep |= {i - 1, i}
        stride = max(1, len(self.samples) // most)
        keep |= set(range(0, len(self.samples), stride))
        return [[round(self.samples[i][0] - start, 2), self.samples[i][1]] for i in sorted(keep)]


def reached(beats: list[tuple[float, int]], step: int) -> float:
    """When a run of (time, step) beats reached `step`: interpolated between the two beats around
    it; its first beat's time if it began past it, its last beat's if it never got there."""
    if step <= beats[0][1]:
        return beats[0][0]
    for (t0, s0), (t1, s1) in itertools.pairwise(beats):
        if s0 <= step <= s1:
            return t0 if s1 == s0 else t0 + (t1 - t0) * (step - s0) / (s1 - s0)
    return max(t for t, s in beats if s == max(step for _, step in beats))


class HeartbeatWatch(threading.Thread):
    """Poll a heartbeat file every 0.2 s; the path may be known only once the workers run."""

    def __init__(self, path_of: Any) -> None:
        super().__init__(daemon=True)
        self.path_of = path_of
        self.log = StepLog()
        self.done = threading.Event()

    def run(self) -> None:
        last = None
        while not self.done.wait(0.2):
            path = self.path_of()
            try:
                raw = Path(path).read_text() if path else None
            except OSError:
                raw = None
            if raw is None or raw == last:
                continue
            last = raw
            try:
                beat = json.loads(raw)
            except ValueError:
                continue
            self.log.samples.append((time.time(), int(beat.get("step") or 0), str(beat.get("status"))))
            # A beat after the last progress (the JIT save's, the final one) keeps its attempt's place.
            attempt = (beat.get("phases") or {}).get("interpreter_up")
            if isinstance(beat.get("time"), (int, float)) and (not self.log.beats or int(beat.get("step") or 0)
                                                               != self.log.beats[-1][1] or attempt != self.log.beats[-1][2]):
                self.log.beats.append((float(beat["time"]), int(beat.get("step") or 0), attempt))

    def stop(self) -> StepLog:
        self.done.set()
        self.join(timeout=5)
        return self.log


# -- disturbances -----------------------------------------------------------------------------------


@dataclass
class Disturbance:
    """`kind` "none", "kill" (kill -9 a random rank every `every` s) or "sigterm" (at `at` s); `jit`
    False: the trainer takes no JIT checkpoint (spx runs only)."""

    kind: str
    every: float = 0.0
    at: float = 0.0
    give_up_s: float | None = None  # a run still unfinished this long after its start: unfinished, goodput 0
    jit: bool = True
    seed: int = 1  # of the kill schedule: which rank each kill hits

    def over(self, start: float) -> bool:
        return self.give_up_s is not None and time.time() - start > self.give_up_s

    @property
    def label(self) -> str:
        label = {"none": "undisturbed", "kill": f"kill -9 every {self.every:g} s",
                 "sigterm": f"SIGTERM (spot reclaim) at {self.at:.0f} s"}[self.kind]
        return label if self.jit else f"{label}, JIT off"


@dataclass
class Outcome:
    wall_s: float
    finished: bool
    kills: list[dict[str, Any]] = field(default_factory=list)
    restarts: int = 0
    misses: int = 0
    unfinished_runs: int = 0
    steps: StepLog = field(default_factory=StepLog)
    start: float = 0.0  # when the run began: the kills' `t` and the step series count from here
    jobs: list[dict[str, Any]] = field(default_factory=list)  # spx: each job's `spx status --json`
    relaunches: list[dict[str, Any]] = field(default_factory=list)  # spx: where each relaunch resumed, and why


class Disturber:
    """Applies a Disturbance to a run whose processes carry `tag`; polled from the run's wait loop."""

    def __init__(self, d: Disturbance, tag: str, seed: int, start: float, stall_timeout: float) -> None:
        self.d, self.tag, self.start, self.stall_timeout = d, tag, start, stall_timeout
        self.rng = random.Random(seed)
        self.next_at = d.every if d.kind == "kill" else d.at
        self.kills: list[dict[str, Any]] = []
        self.fired = False

    def poll(self, steps: StepLog) -> str | None:
        """Fire what is due; return "stalled" when the last kill got no training step back in time."""
        now = time.time()
        if self.d.kind == "kill" and now - self.start >= self.next_at:
            rank = self.rng.randrange(PROCS)
            pid = worker_pids(self.tag).get(rank)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
            self.kills.append({"t": round(now - self.start, 1), "rank": rank, "pid": pid,
                               "step": steps.last_step(), "hit": pid is not None})
            print(f"  t={now - self.start:6.1f} s kill -9 rank {rank} "
                  f"{'pid ' + str(pid) if pid else '(no worker up: skipped)'} near step {steps.last_step()}",
                  flush=True)
            self.next_at += self.d.every
        elif self.d.kind == "sigterm" and not self.fired and now - self.start >= self.next_at:
            pgid = launcher_pgid(self.tag)
            if pgid is not None and pgid != os.getpgid(0):
                os.killpg(pgid, signal.SIGTERM)
                self.fired = True
                self.kills.append({"t": round(now - self.start, 1), "signal": "SIGTERM", "pgid": pgid,
                                   "step": steps.last_step(), "hit": True})
                print(f"  t={now - self.start:6.1f} s SIGTERM to the launcher's group {pgid} near step "
                      f"{steps.last_step()}", flush=True)
        last_hit = next((k for k in reversed(self.kills) if k["hit"]), None)
        if (last_hit is not None and not last_hit.get("missed") and now - self.start - last_hit["t"] > self.stall_timeout
                and not steps.running_since(self.start + last_hit["t"] + 0.5)):
            last_hit["missed"] = True
            return "stalled"
        return None

    def misses(self, steps: StepLog) -> int:
        """Kills after which training never came back before the next kill that hit, or at all."""
        hits = [k for k in self.kills if k["hit"]]
        missed = 0
        for i, k in enumerate(hits):
            t0 = self.start + k["t"] + 0.5
            t1 = self.start + hits[i + 1]["t"] if i + 1 < len(hits) else float("inf")
            if k.get("missed") or not any(t0 < ts < t1 and st == "running" for ts, _, st in steps.samples):
                missed += 1
        return missed


def schedule(d: Disturbance, seed: int, horizon: float) -> str:
    if d.kind != "kill":
        return d.label
    rng = random.Random(seed)
    n = int(horizon // d.every)
    return f"{d.label}: " + ", ".join(f"{(i + 1) * d.every:g} s→rank {rng.randrange(PROCS)}" for i in range(n))


# -- the two launchers ------------------------------------------------------------------------------


def run_torchrun(d: Disturbance, a: argparse.Namespace, work: Path) -> Outcome:
    ck, hb = work / "ck", work / "heartbeat.json"
    tag = run_tag(work)
    env = {**os.environ, "OMP_NUM_THREADS": "1", ENV_HEARTBEAT_FILE: str(hb), **dict([tag.split("=", 1)])}
    watch = HeartbeatWatch(lambda: hb)
    watch.start()
    start = time.time()
    dist = Disturber(d, tag, d.seed, start, a.stall_timeout)
    launches = 0
    finished = False
    log = (work / "torchrun.log").open("w")
    try:
        while not finished and launches < 1 + a.max_restarts and not d.over(start):
            launches += 1
            cmd = [PY, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={PROCS}",
                   f"--max-restarts={a.max_restarts}", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
                   str(SCRIPT), *train_args(a.steps), "--checkpoint-dir", str(ck)]
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            while proc.poll() is None:
                if d.over(start):
                    print(f"  torchrun: not finished after {d.give_up_s:.0f} s: giving up", flush=True)
                    kill_tree(proc)
                    break
                if dist.poll(watch.log) == "stalled":
                    print("  torchrun: no training step since the last kill: relaunching (a miss)", flush=True)
                    kill_tree(proc)
                    break
                time.sleep(0.1)
            finished = proc.returncode == 0
            if proc.returncode not in (0, -signal.SIGKILL) and not finished:
                print(f"  torchrun exited {proc.returncode} before the end: relaunching", flush=True)
        wall = time.time() - start
    finally:
        log.close()
        steps = watch.stop()
    text = (work / "torchrun.log").read_text(errors="replace")
    restarts = text.count("] failed (exitcode:")  # the agent's log line for each worker group failure
    return Outcome(wall, finished, dist.kills, restarts, dist.misses(steps), launches - 1, steps, start)


def spx_job_yaml(name: str, a: argparse.Namespace, ck: Path, tag: str, jit: bool = True,
                 standby_workers: bool = False) -> str:
    argv = ", ".join(f'"{x}"' for x in train_args(a.steps, jit))
    key, value = tag.split("=", 1)
    workers = ", standby_workers: true" if standby_workers else ""
    return (f"name: {name}\nlauncher: torchrun\nscript: {SCRIPT}\npython: {PY}\nargs: [{argv}]\nprocs: {PROCS}\n"
            f"env: {{OMP_NUM_THREADS: '1', {key}: '{value}'}}\ncheckpoints: {{dir: {ck}}}\n"
            f"restart: {{max_restarts: {a.max_restarts}, backoff_seconds: [0, 1]{workers}}}\n"
            "stop: {grace_seconds: 60}\n")


def run_spx(d: Disturbance, a: argparse.Namespace, work: Path, standby_workers: bool = False) -> Outcome:
    """One job on a fresh daemon; a job that fails is submitted again over the same checkpoint dir
    (what its user would do), counted as an unfinished run. `standby_workers`: the job asks for its
    next attempt's workers started ahead (`restart.standby_workers`)."""
    tag = run_tag(work)
    hb: dict[str, Any] = {"path": None, "at": 0.0}

    def heartbeat() -> str | None:  # the daemon's per-job heartbeat path, from a worker's environment
        if time.monotonic() - hb["at"] > 2:
            hb["at"] = time.monotonic()
            for _, env, _ in tagged(tag):
                prefix = f"{ENV_HEARTBEAT_FILE}=".encode()
                found = next((e[len(prefix):].decode() for e in env if e.startswith(prefix)), None)
                if found:
                    hb["path"] = found
                    break
        return hb["path"]

    daemon = Daemon(work / "root")
    daemon.start()
    watch = HeartbeatWatch(heartbeat)
    histories: list[dict[str, Any]] = []
    try:
        start = time.time()  # the disturbances' clock starts at the launch, as torchrun's does
        watch.start()
        dist = Disturber(d, tag, d.seed, start, a.stall_timeout)
        state = None
        while state not in ("succeeded", "gave up") and len(histories) <= a.max_restarts:
            name = f"goodput-{work.name}-{len(histories) + 1}"
            daemon.drop(f"{name}.yaml", spx_job_yaml(name, a, work / "ck", tag, d.jit, standby_workers))
            checked = 0.0
            while True:
                if time.monotonic() - checked > 1:
                    checked = time.monotonic()
                    state = (daemon_query.job(daemon.root, name) or {}).get("state")
                    rejected = daemon.spool / "rejected" / f"{name}.yaml.error"
                    if rejected.exists():
                        raise RuntimeError(rejected.read_text())
                    if state in ("succeeded", "failed", "cancelled"):
                        break
                    if d.over(start):
                        print(f"  spx: not finished after {d.give_up_s:.0f} s: giving up", flush=True)
                        state = "gave up"
                        break
                dist.poll(watch.log)  # a stall is the daemon's to resolve (its hang detection); counted below
                time.sleep(0.1)
            st = daemon.status(name)
            histories.append(st)
            if state not in ("succeeded", "gave up"):
                print(f"  spx: job {name} {state} ({st.get('reason')}): submitting it again", flush=True)
        end = time.time()
    finally:
        steps = watch.stop()
        daemon.stop()
    wall = end - start if state == "gave up" else histories[-1]["history"][-1]["end"] - histories[0]["history"][0]["start"]
    restarts = sum(len(h["history"]) for h in histories) - 1
    return Outcome(wall, state == "succeeded", dist.kills, restarts, dist.misses(steps), len(histories) - 1, steps,
                   start, histories, relaunches(work / "root" / "log", histories))


SURVIVOR_LINES = ("a collective failed", "JIT checkpoint", "SIGTERM received", "closing signal", "failed (exitcode")
"""What an attempt's log says about its end: the survivors' just-in-time checkpoint and torchrun's teardown."""


def relaunches(log_root: Path, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each relaunch's resume step; for one that did not resume from a just-in-time checkpoint the
    attempt before published, the lines of that attempt that say why. The bench's work directory
    goes at its end, so this is what is left to explain a kill that cost steps."""
    out = []
    for job in jobs:
        for attempt in sorted(job["history"], key=lambda h: h["number"])[1:]:
            step = attempt.get("resumed_from_step")
            entry: dict[str, Any] = {"job": job["name"], "attempt": attempt["number"], "resumed_from_step": step}
            before = log_root / job["name"] / f"attempt-{attempt['number'] - 1}.log"
            said = [ln for ln in (before.read_text(errors="replace").splitlines() if before.exists() else [])
                    if any(k in ln for k in SURVIVOR_LINES)]
            jit = step is not None and any(f"step-{step:09d} published" in ln for ln in said)
            if not jit:
                entry["attempt_before_said"] = [ln[:300] for ln in said][:12]
            out.append(entry)
    return out


def print_relaunches(o: Outcome) -> None:
    """The relaunches that did not resume from a just-in-time checkpoint, with what the attempt before said."""
    for r in o.relaunches:
        if "attempt_before_said" in r:
            print(f"  attempt {r['attempt']} resumed from step {r['resumed_from_step']}; attempt {r['attempt'] - 1} "
                  "said:", *(f"    {ln}" for ln in r["attempt_before_said"]), sep="\n", flush=True)


RUNNERS = {"spx": run_spx, "torchrun": run_torchrun,
           "spx-standby-workers": lambda d, a, work: run_spx(d, a, work, standby_workers=True)}
DEFAULT_LAUNCHERS = ["spx", "spx-standby-workers", "torchrun"]


# -- report -----------------------------------------------------------------------------------------


def row(launcher: str, d: Disturbance, o: Outcome, own_floor: float, torchrun_floor: float, steps: int) -> dict[str, Any]:
    computed = o.steps.computed()
    return {
        "launcher": launcher, "disturbance": d.label, "seed": d.seed if d.kind == "kill" else None,
        "wall_s": round(o.wall_s, 1), "finished": o.finished,
        "goodput": round(own_floor / o.wall_s, 3) if o.finished else 0.0,
        "goodput_vs_bare_torchrun": round(torchrun_floor / o.wall_s, 3) if o.finished else 0.0,
        "kills": sum(1 for k in o.kills if k["hit"]), "kills_skipped": sum(1 for k in o.kills if not k["hit"]),
        "restarts": o.restarts, "misses": o.misses, "unfinished_runs": o.unfinished_runs,
        "steps_useful": steps, "steps_computed": computed,
        "steps_recomputed_per_kill": round((computed - steps) / max(1, sum(1 for k in o.kills if k["hit"])), 1)
        if computed and o.finished else None,
        "step_goodput": round(steps / computed, 3) if computed and o.finished else None,
        **(ledger_numbers(o) if o.jobs else {}),
        "kill_log": o.kills,
        "relaunches": o.relaunches,
        "steps": o.steps.series(o.start),
    }


def ledger_numbers(o: Outcome) -> dict[str, Any]:
    """The spx jobs' goodput ledgers (summed over the jobs of a run submitted again) beside the
    bench's own measure of the same: kept training time over the wall time."""
    ledgers = [job["ledger"] for job in o.jobs]
    productive = sum(lg["seconds"]["productive"] for lg in ledgers)
    held = sum(sum(lg["seconds"].values()) - lg["seconds"]["queued"] for lg in ledgers)
    errors = []
    for job in o.jobs:  # a job the bench gave up on is still running: its ledger has no end to sum to
        if job["history"][-1].get("end") is None:
            continue
        wall, lg = job["history"][-1]["end"] - job["submitted"], job["ledger"]
        errors.append(abs(sum(lg["seconds"].values()) + lg["unsettled_seconds"] - wall) / wall)
    return {"ledger_goodput": round(productive / held, 4) if held else None,
            "external_goodput": round(o.steps.kept_training_seconds() / o.wall_s, 4),
            "recomputed_s": round(sum(lg["seconds"]["recomputed"] for lg in ledgers), 2),
            "ledger_sum_error": round(max(errors), 5) if errors else None,
            "ledger_seconds": {k: round(sum(lg["seconds"][k] for lg in ledgers), 2) for k in ledgers[0]["seconds"]}}


def ledger_goals(rows: list[dict[str, Any]]) -> list[Goal]:
    """Issue 27 on the kill -9 runs at the shortest T: the ledger's goodput is the bench's own
    measure (within 0.01), recomputes nothing with JIT checkpoints and something without, and sums
    to the wall time (within 1 %)."""
    kills = [r for r in rows if r["launcher"] == "spx" and r["disturbance"].startswith("kill") and "ledger_goodput" in r]
    if not kills:
        return []
    jit_off_seed = next((r["seed"] for r in kills if "JIT off" in r["disturbance"]), kills[0]["seed"])
    kills = [r for r in kills if r["seed"] == jit_off_seed]  # the pair run with and without, on one schedule
    shortest = min(float(r["disturbance"].split()[3]) for r in kills)
    goals = []
    for r in kills:
        if float(r["disturbance"].split()[3]) != shortest:
            continue
        case = r["disturbance"]
        goals.append(Goal(f"spx ledger goodput - bench's, {case}",
                          round(abs(r["ledger_goodput"] - r["external_goodput"]), 4), "<=", 0.01))
        if r["ledger_sum_error"] is not None:
            goals.append(Goal(f"spx ledger sum - wall (fraction), {case}", r["ledger_sum_error"], "<=", 0.01))
        goals.append(Goal(f"spx ledger recomputed s, {case}", r["recomputed_s"], ">" if "JIT off" in case else "==",
                          0.0, "s"))
    return goals


# Each kill interval's goodput target; any other disturbance is reported against the first.
TARGETS = {"kill -9 every 60 s": 0.95, "kill -9 every 20 s": 0.9}


def goodput_goals(rows: list[dict[str, Any]]) -> list[Goal]:
    """The issues' goals (spx, with or without standby workers, at TARGETS' intervals), spx's
    misses, and, for the table, every other case's goodput against 0.95: "(reported)" for spx's
    other cases, "(baseline)" for torchrun."""
    goals = []
    cases: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r["disturbance"] != "undisturbed":
            cases.setdefault((r["launcher"], r["disturbance"]), []).append(r)
    for (launcher, disturbance), runs in cases.items():
        case = disturbance.split(" at ")[0]  # "SIGTERM (spot reclaim)", without its time
        if not launcher.startswith("spx"):
            tag = "(baseline) "
        else:
            tag = "" if disturbance in TARGETS else "(reported) "
        values = sorted(r["goodput"] for r in runs)
        if len(runs) > 1:  # several kill schedules: the median, and the spread in the name
            case += f" (median of {len(runs)} seeds, {values[0]:.3f}–{values[-1]:.3f})"
        goals.append(Goal(f"{tag}{launcher} goodput, {case}", statistics.median(values), ">=",
                          TARGETS.get(disturbance, 0.95)))
    for launcher in sorted({r["launcher"] for r in rows if r["launcher"].startswith("spx")}):
        jit_kills = [r for r in rows if r["launcher"] == launcher and r["disturbance"].startswith("kill")
                     and "JIT off" not in r["disturbance"] and r["steps_recomputed_per_kill"] is not None]
        if jit_kills:
            shortest = min(float(r["disturbance"].split()[3]) for r in jit_kills)
            worst = max(r["steps_recomputed_per_kill"] for r in jit_kills
                        if float(r["disturbance"].split()[3]) == shortest)
            goals.append(Goal(f"{launcher} steps recomputed per kill, kill -9 every {shortest:g} s (worst seed; JIT "
                              "checkpoints)", worst, "==", 0))
    for launcher in ("spx", "torchrun"):
        kills = [r for r in rows if r["launcher"] == launcher and r["disturbance"].startswith("kill")]
        if kills:
            tag = "" if launcher == "spx" else "(baseline) "
            goals.append(Goal(f"{tag}{launcher} misses + unfinished runs, kill -9 runs",
                              sum(r["misses"] + r["unfinished_runs"] for r in kills), "==", 0))
    return goals


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="500 steps, T = 60 s only")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default 1200; --quick 500)")
    ap.add_argument("--intervals", type=float, nargs="+", default=None, help="kill every T s (default 60 20)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the kill schedule")
    ap.add_argument("--seeds", type=int, nargs="+", default=None,
                    help="the kill -9 runs at the shortest T, once per seed (the kill drawn over every rank each "
                         "time): the table shows their median and spread")
    ap.add_argument("--max-restarts", type=int, default=100)
    ap.add_argument("--stall-timeout", type=float, default=120.0)
    ap.add_argument("--give-up", type=float, default=4.0,
                    help="a disturbed run unfinished after this many times its undisturbed wall time is unfinished")
    ap.add_argument("--launchers", nargs="+", default=DEFAULT_LAUNCHERS, choices=list(RUNNERS))
    ap.add_argument("--ledger-check", action="store_true",
                    help="only spx's kill -9 every 20 s (or --intervals), with and without JIT checkpoints: the "
                         "goodput ledger against the bench's measure (bench/results/goodput_ledger.json)")
    a = ap.parse_args()
    if a.ledger_check:
        return ledger_check(a)
    a.steps = a.steps or (500 if a.quick else 1200)
    intervals = a.intervals or ([60.0] if a.quick else [60.0, 20.0])
    t0 = time.time()
    rows: list[dict[str, Any]] = []
    floors: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="spx-bench-goodput-") as tmp:
        base = Path(tmp)
        runs = 0

        def once(launcher: str, d: Disturbance) -> Outcome:
            nonlocal runs
            runs += 1
            work = base / f"r{runs}"
            work.mkdir()
            print(f"{launcher}: {d.label}", flush=True)
            if launcher in floors:
                d = replace(d, give_up_s=a.give_up * floors[launcher])
            o = RUNNERS[launcher](d, a, work)
            print(f"  → {o.wall_s:.1f} s, finished {o.finished}, restarts {o.restarts}, misses {o.misses}", flush=True)
            print_relaunches(o)
            return o

        undisturbed = {launcher: once(launcher, Disturbance("none")) for launcher in a.launchers}
        floors = {launcher: o.wall_s for launcher, o in undisturbed.items()}
        seeds = a.seeds or [a.seed]
        disturbances = [Disturbance("kill", every=t, seed=seed) for t in intervals
                        for seed in (seeds if t == min(intervals) else seeds[:1])]
        disturbances.append(Disturbance("sigterm", at=round(min(floors.values()) / 2)))
        # spx only: the ledger's recomputed time
        jit_off = Disturbance("kill", every=min(intervals), jit=False, seed=seeds[0])
        for d in disturbances:
            print(f"seed {d.seed}: {schedule(d, d.seed, 2 * max(floors.values()))}" if d.kind == "kill"
                  else d.label, flush=True)
        torchrun_floor = floors.get("torchrun", min(floors.values()))
        for launcher, o in undisturbed.items():
            rows.append(row(launcher, Disturbance("none"), o, floors[launcher], torchrun_floor, a.steps))
        for d in disturbances:
            for launcher in a.launchers:
                rows.append(row(launcher, d, once(launcher, d), floors[launcher], torchrun_floor, a.steps))
        if "spx" in a.launchers:
            rows.append(row("spx", jit_off, once("spx", jit_off), floors["spx"], torchrun_floor, a.steps))
    print(f"\nwork: {a.steps} steps of a 2-rank DDP job (checkpoint every {CHECKPOINT_EVERY}); kill seeds {seeds}; "
          f"bench took {time.time() - t0:.0f} s")
    head = f"{'launcher':<9} {'disturbance':<30} {'seed':>4} {'wall s':>7} {'goodput':>8} {'vs bare':>8} {'kills':>5} " \
           f"{'restarts':>8} {'misses':>6} {'unfinished':>10} {'steps computed':>14}"
    print(head)
    for r in rows:
        print(f"{r['launcher']:<9} {r['disturbance']:<30} {r['seed'] or '':>4} {r['wall_s']:>7.1f} {r['goodput']:>8.3f} "
              f"{r['goodput_vs_bare_torchrun']:>8.3f} {r['kills']:>5} {r['restarts']:>8} {r['misses']:>6} "
              f"{r['unfinished_runs']:>10} {r['steps_computed']:>14}")
    print_ledgers(rows)
    goals = goodput_goals(rows) + ledger_goals(rows)
    path = write_result("goodput", rows, goals)
    print(f"wrote {path}")
    return 0 if all(g.met for g in goals if not g.name.startswith("(")) else 1


def print_ledgers(rows: list[dict[str, Any]]) -> None:
    """The spx runs' goodput ledgers beside the bench's own measure."""
    print(f"\n{'spx run':<36} {'ledger goodput':>14} {'bench measure':>13} {'recomputed s':>12} {'sum - wall':>10}")
    for r in rows:
        if "ledger_goodput" in r:
            print(f"{r['disturbance']:<36} {r['ledger_goodput']:>14.4f} {r['external_goodput']:>13.4f} "
                  f"{r['recomputed_s']:>12.2f} "
                  f"{'-' if r['ledger_sum_error'] is None else format(r['ledger_sum_error'], '.2%'):>10}")
            print("  ledger: " + ", ".join(f"{k} {v:g}" for k, v in r["ledger_seconds"].items() if v))


def ledger_check(a: argparse.Namespace) -> int:
    """spx alone, kill -9 every T s with JIT checkpoints and without: the issue-27 checks."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="spx-bench-goodput-") as tmp:
        for i, d in enumerate(Disturbance("kill", every=t, jit=jit, seed=a.seed) for t in (a.intervals or [20.0])
                              for jit in (True, False)):
            work = Path(tmp) / f"r{i}"
            work.mkdir()
            print(f"spx: {d.label}\n{schedule(d, d.seed, 600)}", flush=True)
            o = run_spx(d, a, work)
            print(f"  → {o.wall_s:.1f} s, finished {o.finished}, restarts {o.restarts}, misses {o.misses}", flush=True)
            print_relaunches(o)
            rows.append(row("spx", d, o, o.wall_s, o.wall_s, a.steps))
    print_ledgers(rows)
    goals = ledger_goals(rows)
    for goal in goals:
        print(f"  {goal.name}: {goal.value:g} {goal.op} {goal.target:g}: {'met' if goal.met else 'NOT MET'}")
    print(f"wrote {write_result('goodput_ledger', rows, goals)}")
    return 0 if all(g.met for g in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
