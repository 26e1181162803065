"""Recovery of one job across two hosts: spx-trainer against bare torchrun's own `--max-restarts`.

    .venv/bin/python bench/bench_multinode.py [--kills 20] [--quick] [--seed S] [--stall 45]

Two "hosts" on this machine: network namespaces joined by a veth pair (tests/netns_hosts.py), one
shared checkpoint dir, examples/train_ddp.py on 2 nodes × 2 processes (gloo on CPU, tiny model,
0.2 s per step, a checkpoint every 5 steps), c10d rendezvous at host 0. Each launcher gets K kills:
a worker on host 1 is `kill -9`'d once both hosts have trained 5–9 steps (drawn from
`random.Random(seed)`, printed) since they last started. After each kill the bench waits for both
hosts to reach a first step again (the `first_step` phase in each host's heartbeat, from a worker
started after the kill); recovery time is kill → the later host's first step. A kill not recovered
within --stall seconds is a miss: the run is ended (every process of it killed) and started again
over the same checkpoints, as a user's retry would, so the K kills may span several runs. After the
last kill the run trains to the end; its final model is compared with an undisturbed run's (bare
torchrun, same hosts and arguments).

- spx: a real `spx-trainer` in each namespace (own --root, fake GPUs), the same job file in both
  spools, `restart: {max_restarts: 100, backoff_seconds: [0, 1]}`; every failure restarts both
  hosts' shares into a new generation (docs/multinode.md).
- torchrun: `python -m torch.distributed.run --nnodes=2 --max-restarts=100` in each namespace; its
  agents re-rendezvous in the same round; the trainer resumes from the shared dir by itself.

The same run then measures spx's one-host relaunch of the same job: its 4 ranks on host 0 alone
(`spx-one-host-4`: the same work on the same 2 cores, which both "hosts" here share), and one host's
share alone (`spx-one-host-2`: 2 ranks, half the CPU load), with a worker on that host killed the
same way. Each spx row has the restart's phases (`phases_median_s`: per phase of run/timeline.py, the
median over kills of kill → that phase on the later host), read from every host's `spx status
--timeline`.

Goals: spx reaches a first step again after every kill and ends with the uninterrupted model
(issue 16); kill → first step on both hosts ≤ 1.5× the one-host relaunch of the same 4 ranks in the
same run (issue 29); the recovery times and torchrun's figures are reported beside them.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import Goal, write_result  # noqa: E402
from netns_hosts import IFNAME, Hosts, NetnsUnavailable, two_hosts  # noqa: E402
from process_tree import kill_tree  # noqa: E402

from harness import EXAMPLES, Daemon  # noqa: E402
from spx.daemon.contract.worker_env import Heartbeat, read_heartbeat  # noqa: E402

PY = sys.executable
SCRIPT = EXAMPLES / "train_ddp.py"
RDZV_PORT = 29400
HASH = re.compile(r"final_state_sha256=([0-9a-f]{64})")
TAG = "BENCH_MULTINODE_RUN"  # SPX_* names are the daemon's
ONE_HOST = "spx-one-host-4"  # the same job's 4 ranks on host 0 alone: what a restart across hosts is compared with
ONE_HOST_2 = "spx-one-host-2"  # one host's share alone (2 ranks): half the CPU load of the other two here


def train_args(steps: int, sleep: float = 0.2) -> list[str]:
    """The sleep is in the step hook only: it paces the run for the kills and leaves the model as it is."""
    return ["--batch_size", "4", "--model-size", "tiny", "--seed", "11", "--steps", str(steps), "--checkpoint-every", "5",
            "--dataset-size", "128", "--sleep-per-step", str(sleep)]


def in_namespace(pid: int, ns: str) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{ns}").st_ino
    except OSError:
        return False


def workers(run_id: str, ns: str) -> list[int]:
    """This run's training workers in namespace `ns` (torchrun sets LOCAL_RANK in each)."""
    tag = f"{TAG}={run_id}".encode()
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            env = Path(entry.path, "environ").read_bytes().split(b"\0")
            state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if (tag in env and state not in ("Z", "X") and any(e.startswith(b"LOCAL_RANK=") for e in env)
                and in_namespace(int(entry.name), ns)):
            out.append(int(entry.name))
    return out


@dataclass
class Tally:
    kills: int = 0
    recovered: int = 0
    misses: int = 0
    runs: int = 0
    recovery_s: list[float] = field(default_factory=list)
    finished: bool = False
    final_hash: str | None = None
    killed_at: list[float] = field(default_factory=list)  # wall time of each recovered kill
    timelines: list[list[dict]] = field(default_factory=list)  # per run, every host's `spx status --timeline` rows


class Launch:
    """One run of the job on both hosts; `beats()` gives each host's heartbeat, `done()` whether it
    ended (and how), `stop()` ends it and everything it started. Its processes carry TAG=run_id."""

    run_id = ""
    victim_host = 1  # the namespace whose workers are killed

    def beats(self) -> list[Heartbeat | None]:
        raise NotImplementedError

    def timelines(self) -> list[dict]:
        """Every host's phases of every attempt (spx only), each row with its host's index."""
        return []

    def done(self) -> bool | None:
        """None while it runs; True when it finished the training; False when it ended otherwise."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def logs(self) -> str:
        raise NotImplementedError


class TorchrunLaunch(Launch):
    def __init__(self, hosts: Hosts, work: Path, run_id: str, steps: int, max_restarts: int, sleep: float = 0.2) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.run_id = run_id
        self.hb = [work / f"{run_id}-hb{i}.json" for i in (0, 1)]  # per run: no earlier run's beat is read
        self.log_paths = [work / f"{run_id}-torchrun{i}.log" for i in (0, 1)]
        self.procs: list[subprocess.Popen] = []
        port = RDZV_PORT
        for i, ns in enumerate(hosts.namespaces):
            env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": IFNAME, TAG: run_id,
                   "SPX_HEARTBEAT_FILE": str(self.hb[i]), "SPX_CHECKPOINT_DIR": str(work / "ckpt")}
            conf = ["--rdzv-conf=is_host=true"] if i == 0 else []
            cmd = ["ip", "netns", "exec", ns, PY, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
                   "--rdzv-backend=c10d", f"--rdzv-endpoint={hosts.addresses[0]}:{port}", "--rdzv-id=bench",
                   f"--local-addr={hosts.addresses[i]}", *conf, f"--max-restarts={max_restarts}", str(SCRIPT),
                   *train_args(steps, sleep)]
            with self.log_paths[i].open("w") as out:
                self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                                   start_new_session=True))

    def beats(self) -> list[Heartbeat | None]:
        return [read_heartbeat(p) if p.exists() else None for p in self.hb]

    def done(self) -> bool | None:
        codes = [p.poll() for p in self.procs]
        if any(c is None for c in codes):
            return None
        return all(c == 0 for c in codes)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                kill_tree(p)

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.log_paths)


class SpxLaunch(Launch):
    """The job on both hosts, 2 ranks each; with `one_host`, all `procs` of its ranks on host 0 alone
    (the same job without `nodes`: the one-host relaunch the same run compares with)."""

    def __init__(self, hosts: Hosts, work: Path, run_id: str, steps: int, max_restarts: int,
                 one_host: bool = False, procs: int = 2) -> None:
        self.run_id = run_id
        spaces = hosts.namespaces[:1] if one_host else hosts.namespaces
        self.victim_host = 0 if one_host else 1
        self.daemons = [Daemon(work / f"{run_id}-host{i}", gpu_backend="fake", prefix=["ip", "netns", "exec", ns])
                        for i, ns in enumerate(spaces)]
        argv = ", ".join(f'"{a}"' for a in train_args(steps))
        nodes = "" if one_host else f"nodes: {{count: 2, rdzv_endpoint: '{hosts.addresses[0]}:{RDZV_PORT}'}}\n"
        text = (f"name: wide\nlauncher: torchrun\nscript: {SCRIPT}\npython: {PY}\nargs: [{argv}]\n"
                f"gpus: {procs}\nprocs: {procs}\n"
                f"env: {{GLOO_SOCKET_IFNAME: {IFNAME}, OMP_NUM_THREADS: '1', {TAG}: '{run_id}'}}\n"
                f"restart: {{max_restarts: {max_restarts}, backoff_seconds: [0, 1]}}\nstop: {{grace_seconds: 10}}\n"
                f"checkpoints: {{dir: {work / 'ckpt'}}}\n{nodes}")
        for d in self.daemons:
            d.start()
        for d in self.daemons:
            d.drop("wide.yaml", text)
        for d in self.daemons:  # accepted (a refusal would leave the bench waiting for nothing)
            d.wait_state("wide", {"queued", "starting", "running"}, 30)

    def beats(self) -> list[Heartbeat | None]:
        out: list[Heartbeat | None] = []
        for d in self.daemons:
            found = sorted((d.root / "run" / "jobs").glob("*-wide/heartbeat.json"))
            out.append(read_heartbeat(found[-1]) if found else None)
        return out

    def done(self) -> bool | None:
        states = [(d.job("wide") or {}).get("state") for d in self.daemons]
        if all(s == "succeeded" for s in states):
            return True
        if any(s in ("failed", "cancelled") for s in states):
            return False
        return None

    def timelines(self) -> list[dict]:
        rows = []
        for i, d in enumerate(self.daemons):
            out = d.spx("status", "wide", "--timeline", "--json", check=False)
            rows += [{**r, "host": i} for r in (json.loads(out.stdout) if out.returncode == 0 else [])]
        return rows

    def stop(self) -> None:
        for d in self.daemons:
            d.stop(timeout=60)

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for d in self.daemons
                       for p in sorted((d.root / "log" / "wide").glob("attempt-*.log")))


def first_step_after(beat: Heartbeat | None, t: float) -> float | None:
    """When a worker started after `t` made its first step, by its heartbeat."""
    first = (beat.phases or {}).get("first_step") if beat is not None else None
    return first if first is not None and first > t else None


def measure(make: type[Launch], hosts: Hosts, work: Path, a: argparse.Namespace, rng: random.Random) -> Tally:
    tally = Tally()
    while tally.runs <= 2 * a.kills + 2:
        tally.runs += 1
        since = time.time()
        launch = make(hosts, work, f"{work.name}-{tally.runs}", a.steps, 100)
        missed = False
        try:
            while tally.kills < a.kills and not missed:
                outcome = kill_once(launch, hosts, work, a, rng, since, tally)
                if outcome is None:
                    break  # the run ended, or never trained: below
                missed, since = outcome[0] == "missed", outcome[1]
            if not missed:  # after the last kill (or a run that ended on its own): to the end
                end = time.time() + a.steps * 0.5 + 120
                while launch.done() is None and time.time() < end:
                    time.sleep(0.5)
            finished = launch.done()
            hashes = HASH.findall(launch.logs())
            tally.timelines.append(launch.timelines())
        finally:
            launch.stop()
        if finished:  # all kills done, or the training ended before the last one (fewer kills: reported)
            tally.finished, tally.final_hash = True, hashes[-1] if hashes else None
            return tally
    return tally


def kill_once(launch: Launch, hosts: Hosts, work: Path, a: argparse.Namespace, rng: random.Random, since: float,
              tally: Tally) -> tuple[str, float] | None:
    """Wait until both hosts trained 5-9 steps with workers started after `since`, kill a worker on
    host 1, wait for a first step on both: ("recovered" or "missed", the kill's time); None if the
    run ended or did not train in --stall s."""
    past, base = rng.randint(5, 9), None
    deadline = time.time() + a.stall
    while True:
        if time.time() > deadline or launch.done() is not None:
            return None
        beats = launch.beats()
        if all(first_step_after(b, since) for b in beats):
            base = base or [b.step for b in beats if b is not None]
            if all(b is not None and b.step >= s + past for b, s in zip(beats, base, strict=True)):
                victims = workers(launch.run_id, hosts.namespaces[launch.victim_host])
                if victims:
                    break
        time.sleep(0.1)
    os.kill(rng.choice(victims), signal.SIGKILL)
    killed, tally.kills = time.time(), tally.kills + 1
    while time.time() - killed < a.stall:
        firsts = [first_step_after(b, killed) for b in launch.beats()]
        if all(firsts):
            recovered = max(f for f in firsts if f is not None) - killed
            tally.recovered += 1
            tally.recovery_s.append(round(recovered, 2))
            tally.killed_at.append(killed)
            print(f"  {work.name} kill {tally.kills}: every host at a first step {recovered:.1f} s later", flush=True)
            return "recovered", killed
        time.sleep(0.1)
    tally.misses += 1
    print(f"  {work.name} kill {tally.kills}: no first step on every host in {a.stall:.0f} s (a miss): run ended, "
          "started again over the same checkpoints", flush=True)
    return "missed", killed


def reference_hash(hosts: Hosts, work: Path, steps: int) -> str:
    launch = TorchrunLaunch(hosts, work, work.name, steps, 0, sleep=0.0)
    try:
        while launch.done() is None:
            time.sleep(0.5)
        found = HASH.findall(launch.logs())
        assert launch.done() and found, launch.logs()[-3000:]
        return found[-1]
    finally:
        launch.stop()


MILESTONES = ("worker_exit", "launcher_exit", "group_dead", "end_recorded", "joined", "spawn", "interpreter_up",
              "torch_imported", "rendezvous", "first_step")
"""The phases of a restart (run/timeline.py) the breakdown reads, in order: each host's teardown
(worker_exit … group_dead), the agreement and the end stored (end_recorded), the join of the next
generation (joined, across hosts only), the checkpoint search (spawn), the agents' rendezvous and
the workers' start (interpreter_up), torch's import, the process group of every rank (rendezvous),
the resume and the first step."""


def phases_after_kills(t: Tally) -> dict[str, float]:
    """Per milestone, the median over kills of kill → that phase on the later host (the first time each
    host reached it after the kill and before the next one)."""
    rows = [r for rows in t.timelines for r in rows]
    kills = sorted(t.killed_at)
    at: dict[str, list[float]] = {m: [] for m in MILESTONES}
    for i, killed in enumerate(kills):
        until = kills[i + 1] if i + 1 < len(kills) else float("inf")
        for m in MILESTONES:
            per_host: dict[int, float] = {}
            for r in rows:
                if r["phase"] == m and killed <= r["time"] < until:
                    per_host[r["host"]] = min(per_host.get(r["host"], r["time"]), r["time"])
            if per_host:
                at[m].append(max(per_host.values()) - killed)
    return {m: round(statistics.median(v), 2) for m, v in at.items() if v}


def row(launcher: str, t: Tally, reference: str | None) -> dict:
    rec = t.recovery_s
    return {"launcher": launcher, "kills": t.kills, "recovered": t.recovered, "misses": t.misses, "runs": t.runs,
            "recovery_median_s": round(statistics.median(rec), 2) if rec else None,
            "recovery_max_s": max(rec) if rec else None, "recovery_s": rec, "finished": t.finished,
            "final_hash_equal": None if reference is None else t.final_hash == reference,
            "phases_median_s": phases_after_kills(t)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="3 kills per launcher")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 10_000)
    ap.add_argument("--stall", type=float, default=45.0, help="seconds without a first step on both hosts: a miss")
    a = ap.parse_args()
    if a.quick:
        a.kills = 3
    a.steps = 15 * a.kills + 40  # each kill costs up to a checkpoint interval of steps done again
    print(f"seed {a.seed}; {a.kills} kills per launcher; {a.steps} steps", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-multinode-") as tmp:
        try:
            with two_hosts() as hosts:
                reference = reference_hash(hosts, Path(tmp) / "reference", a.steps)
                tallies = {}
                for name, make in (("spx", SpxLaunch), ("torchrun", TorchrunLaunch),
                                   (ONE_HOST, functools.partial(SpxLaunch, one_host=True, procs=4)),
                                   (ONE_HOST_2, functools.partial(SpxLaunch, one_host=True, procs=2))):
                    work = Path(tmp) / name
                    work.mkdir()
                    tallies[name] = measure(make, hosts, work, a, random.Random(a.seed))
        except NetnsUnavailable as e:
            print(f"bench_multinode needs network namespaces: {e}", file=sys.stderr)
            return 2
    rows = [row(name, t, reference if name in ("spx", "torchrun") else None) for name, t in tallies.items()]
    spx, torchrun, one, one2 = tallies["spx"], tallies["torchrun"], tallies[ONE_HOST], tallies[ONE_HOST_2]
    goals = [
        Goal("spx kills after which both hosts reached a first step / kills", spx.recovered / max(1, spx.kills), "==", 1),
        Goal("(baseline) torchrun --max-restarts: kills recovered / kills", torchrun.recovered / max(1, torchrun.kills), "==", 1),
        Goal("spx ends with the uninterrupted model (bitwise)", float(spx.finished and spx.final_hash == reference), "==", 1),
    ]
    if spx.recovery_s:
        goals.append(Goal("(reported) spx recovery across hosts, kill -> first step on both, median",
                          statistics.median(spx.recovery_s), "<=", 60, "s"))
    if spx.recovery_s and one.recovery_s:
        goals.append(Goal("spx kill -> first step on both hosts / on one host (the same 4 ranks, same run), medians",
                          statistics.median(spx.recovery_s) / statistics.median(one.recovery_s), "<=", 1.5))
    if spx.recovery_s and one2.recovery_s:
        goals.append(Goal("(reported) spx across hosts / one host with one host's 2 ranks (half the CPU load here), "
                          "medians", statistics.median(spx.recovery_s) / statistics.median(one2.recovery_s), "<=", 1.5))
    if torchrun.recovery_s:
        goals.append(Goal("(baseline) torchrun in-agent recovery across hosts, median",
                          statistics.median(torchrun.recovery_s), "<=", 60, "s"))
    for r in rows:
        print(r, flush=True)
    write_result("multinode", rows, goals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
