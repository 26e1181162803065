"""Checkpoint tiers and JIT checkpoints: what a save stalls, what a restart loads, what a kill loses.

    .venv/bin/python bench/bench_checkpoint_tiers.py          (as root: it makes a loop device)

1. Stall and restart-load time, local tier vs the persistent volume alone. The "persistent volume"
   is an ext4 file system on a loop device whose bandwidth is throttled with the blkio controller
   (cgroup v1 `blkio.throttle.{read,write}_bps_device`; this host's cgroup v2 has no io controller, so
   v2 `io.max` cannot be used here) — the measuring process runs in that cgroup, so its fsyncs and
   cold reads of the volume go at the throttled rate, as on a shared network volume. The local tier
   is /dev/shm (RAM). Measured with the trainer's own Checkpointer: a blocking save (what a
   SIGTERM/JIT/final checkpoint stalls), the async save's stall (host snapshot), the time until the
   checkpoint is complete in the persistent dir, and the load of the latest checkpoint on restart
   (page cache dropped first). Without root or loop devices it says so and skips part 1.
2. Steps lost per worker kill on 2-rank DDP under real torchrun (gloo, CPU): rank 1 kill -9'd at
   random steps between periodic checkpoints; lost = the last step any rank completed − the step the
   next attempt resumes from. With JIT vs what the periodic checkpoint alone would have kept; one run
   resumed to the end and its final hash compared with an uninterrupted run. ZeRO-3 (DeepSpeed on CPU):
   periodic only, one kill, resumed, hash compared.

Goal (issue 17): ≤ 1 step lost per worker failure on DDP.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from benchlib import Goal, write_result  # noqa: E402
from process_tree import descendants, kill_tree  # noqa: E402

EXAMPLES = ROOT / "examples"
PY = sys.executable
THROTTLE_BPS = int(os.environ.get("SPX_BENCH_THROTTLE_MBPS", "40")) * 2**20
PARAMS = int(os.environ.get("SPX_BENCH_PARAMS", str(6_000_000)))  # ×3 (AdamW) × 4 bytes ≈ 72 MB per checkpoint


# ---- part 1: tiers ------------------------------------------------------------------------------

@contextmanager
def throttled_volume(size_mb: int = 1200):
    """An ext4 loop device mounted at a temp dir, and a blkio cgroup throttling it."""
    work = Path(tempfile.mkdtemp(prefix="spx-bench-tiers-"))
    img, mnt = work / "volume.img", work / "persistent"
    mnt.mkdir()
    cg = Path("/sys/fs/cgroup/blkio") / f"spx-bench-{uuid.uuid4().hex[:8]}"
    loop = None
    try:
        with img.open("wb") as f:
            f.truncate(size_mb * 2**20)
        loop = subprocess.run(["losetup", "-f", "--show", str(img)], check=True, capture_output=True,
                              text=True).stdout.strip()
        subprocess.run(["mkfs.ext4", "-q", loop], check=True)
        subprocess.run(["mount", loop, str(mnt)], check=True)
        rdev = os.stat(loop).st_rdev
        dev = f"{os.major(rdev)}:{os.minor(rdev)}"
        cg.mkdir()
        (cg / "blkio.throttle.write_bps_device").write_text(f"{dev} {THROTTLE_BPS}")
        (cg / "blkio.throttle.read_bps_device").write_text(f"{dev} {THROTTLE_BPS}")
        yield mnt, cg
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
        if loop:
            subprocess.run(["losetup", "-d", loop], capture_output=True)
        if cg.exists():
            cg.rmdir()
        shutil.rmtree(work, ignore_errors=True)


TIER_CHILD = r'''
import json, os, sys, time, torch
from pathlib import Path
from spx.trainer.checkpoint import Checkpointer
from spx.trainer.tiers import Replicator
from spx.daemon.contract import checkpoint_layout as layout, checkpoint_tiers

persistent, local, params, mode = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.manual_seed(0)
model = torch.nn.Linear(params // 1000, 1000)
opt = torch.optim.AdamW(model.parameters())
model(torch.randn(4, params // 1000)).sum().backward(); opt.step()
state = lambda: {"model": model.state_dict(), "optimizer": opt.state_dict()}
out = {}
ck = Checkpointer(persistent, rank=0, world_size=1, token=mode, keep=2)
if mode == "tiered":
    ck.use_local_tier(local)
for i, step in enumerate((10, 20, 30)):
    t = time.monotonic()
    ck.save(step, 0, {"r": 0}, state, blocking=True)
    out.setdefault("blocking_stall_s", []).append(time.monotonic() - t)
    ck.wait_replicas()
    out.setdefault("until_persistent_s", []).append(time.monotonic() - t)
for step in (40, 50):
    t = time.monotonic()
    ck.save(step, 0, {"r": 0}, state, blocking=False)
    out.setdefault("async_stall_s", []).append(time.monotonic() - t)
    ck.wait(); ck.wait_replicas()
out["bytes"] = sum(f["size"] for f in layout.read_manifest(persistent / layout.step_dirname(50))["files"])
os.sync()
Path("/proc/sys/vm/drop_caches").write_text("3")
t = time.monotonic()
choice = checkpoint_tiers.latest_complete(persistent, local if mode == "tiered" else None)
torch.load(choice.ref.path / "model.pt", weights_only=True)
out["restart_load_s"] = time.monotonic() - t
out["loaded_from"] = choice.tier
print(json.dumps(out))
'''


def tier_rows() -> tuple[list[dict], list[Goal], str]:
    if os.geteuid() != 0 or shutil.which("losetup") is None or not Path("/sys/fs/cgroup/blkio").is_dir():
        return [], [], "skipped: needs root, losetup and the blkio cgroup controller"
    rows, by_mode = [], {}
    with throttled_volume() as (mnt, cg):
        for mode in ("persistent-only", "tiered"):
            persistent = mnt / mode
            local = Path("/dev/shm") / f"spx-bench-{uuid.uuid4().hex[:8]}"
            try:
                script = f"open('{cg}/cgroup.procs','w').write(str(os.getpid()))\n"
                proc = subprocess.run([PY, "-c", "import os\n" + script + TIER_CHILD, str(persistent), str(local),
                                       str(PARAMS), mode], capture_output=True, text=True, timeout=600,
                                      env={**os.environ, "OMP_NUM_THREADS": "1"})
                if proc.returncode != 0:
                    raise RuntimeError(proc.stderr[-3000:])
                m = json.loads(proc.stdout.strip().splitlines()[-1])
            finally:
                shutil.rmtree(local, ignore_errors=True)
            by_mode[mode] = m
            rows.append({
                "case": f"checkpoint {mode} ({m['bytes'] / 2**20:.0f} MiB, persistent volume at "
                        f"{THROTTLE_BPS / 2**20:.0f} MiB/s)",
                "blocking_save_stall_s": round(statistics.median(m["blocking_stall_s"]), 3),
                "async_save_stall_s": round(statistics.median(m["async_stall_s"]), 3),
                "until_complete_in_persistent_s": round(statistics.median(m["until_persistent_s"]), 3),
                "restart_load_s": round(m["restart_load_s"], 3),
                "restart_loaded_from": m["loaded_from"],
            })
    p, t = by_mode["persistent-only"], by_mode["tiered"]
    goals = [
        Goal("blocking save stall, local tier / persistent only",
             round(statistics.median(t["blocking_stall_s"]) / statistics.median(p["blocking_stall_s"]), 3), "<=", 0.5),
        Goal("restart load, local tier / persistent only", round(t["restart_load_s"] / p["restart_load_s"], 3), "<=", 0.5),
    ]
    return rows, goals, f"cgroup v1 blkio throttle on a loop device ({THROTTLE_BPS / 2**20:.0f} MiB/s read and write)"


# ---- part 2: steps lost per worker kill -----------------------------------------------------------

DDP_ARGS = ["--batch_size", "8", "--model-size", "tiny", "--seed", "1234", "--steps", "60", "--checkpoint-every", "10",
            "--dataset-size", "256"]
_BOUNDARY = re.compile(r"^rank-(\d{5})\.step-(\d{9})\.pt$")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(work: Path, name: str, argv: list[str], ckpt: Path, attempt: int) -> tuple[subprocess.Popen, Path]:
    log = work / f"{name}-a{attempt}.log"
    env = {**os.environ, "SPX_CHECKPOINT_DIR": str(ckpt), "SPX_HEARTBEAT_FILE": str(work / f"{name}-a{attempt}.hb"),
           "SPX_ATTEMPT": str(attempt), "OMP_NUM_THREADS": "1"}
    env.pop("SPX_LOCAL_CHECKPOINT_DIR", None)
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc, log


def torchrun(work: Path, name: str, extra: list[str], ckpt: Path, attempt: int = 1):
    return launch(work, name, [PY, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
                               "--master-addr=127.0.0.1", f"--master-port={free_port()}",
                               str(EXAMPLES / "train_ddp.py"), *DDP_ARGS, *extra], ckpt, attempt)


def deepspeed(work: Path, name: str, extra: list[str], ckpt: Path, attempt: int = 1):
    world = base64.urlsafe_b64encode(json.dumps({"localhost": [0, 1]}).encode()).decode()
    return launch(work, name, [PY, "-m", "deepspeed.launcher.launch", f"--world_info={world}",
                               "--master_addr=127.0.0.1", f"--master_port={free_port()}",
                               str(EXAMPLES / "train_deepspeed.py"), "--deepspeed", "--deepspeed_config",
                               str(EXAMPLES / "ds_config.json"), "--model-size", "tiny", "--seed", "5", "--steps", "9",
                               "--checkpoint-every", "3", *extra], ckpt, attempt)


def final_hash(log: Path) -> str:
    found = re.findall(r"^final_state_sha256=([0-9a-f]{64})$", log.read_text(errors="replace"), re.M)
    assert len(found) == 1, log.read_text(errors="replace")[-3000:]
    return found[0]


def rank_pid(launcher: int, rank: int) -> int | None:
    for pid in descendants(launcher):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and f"LOCAL_RANK={rank}".encode() in env:
            return pid
    return None


def boundary_steps(ckpt: Path) -> dict[int, int]:
    best: dict[int, int] = {}
    for d in ckpt.glob(".spx-boundary-*"):
        for f in d.iterdir():
            if m := _BOUNDARY.match(f.name):
                best[int(m.group(1))] = max(best.get(int(m.group(1)), 0), int(m.group(2)))
    return best


def latest_step(ckpt: Path) -> int | None:
    sys.path.insert(0, str(ROOT))
    from spx.daemon.contract import checkpoint_layout as layout

    ref = layout.latest_complete(ckpt)
    return ref.step if ref else None


def wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.01)
    return value


def steps_lost_rows(work: Path, kills: int, rnd: random.Random) -> tuple[list[dict], list[Goal]]:
    ref, ref_log = torchrun(work, "ddp-reference", [], work / "ddp-reference-ckpt")
    assert ref.wait(600) == 0, ref_log.read_text()[-3000:]
    reference = final_hash(ref_log)
    lost_jit, lost_periodic, resumed_equal = [], [], None
    for i in range(kills):
        kill_at = rnd.choice([s for s in range(12, 50) if 1 < s % 10 < 9])
        ckpt = work / f"ddp-kill{i}-ckpt"
        proc, log = torchrun(work, f"ddp-kill{i}", ["--sleep-per-step", "0.2"], ckpt)
        wait(lambda c=ckpt, k=kill_at, p=proc: boundary_steps(c).get(1, 0) >= k or p.poll() is not None, 300,
             "kill step")
        victim = rank_pid(proc.pid, 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        proc.wait(120)
        kill_tree(proc)
        finished = max(boundary_steps(ckpt).values())
        resume = latest_step(ckpt) or 0
        lost_jit.append(finished - resume)
        lost_periodic.append(finished - finished // 10 * 10)
        if i == 0:
            again, again_log = torchrun(work, f"ddp-kill{i}", [], ckpt, attempt=2)
            assert again.wait(600) == 0, again_log.read_text()[-3000:]
            resumed_equal = final_hash(again_log) == reference

    ds_ref, ds_ref_log = deepspeed(work, "ds-reference", [], work / "ds-reference-ckpt")
    assert ds_ref.wait(900) == 0, ds_ref_log.read_text()[-3000:]
    ckpt = work / "ds-kill-ckpt"
    ds, ds_log = deepspeed(work, "ds-kill", ["--sleep-per-step", "1"], ckpt)
    kill_at = rnd.choice([4, 5, 7, 8])
    hb = work / "ds-kill-a1.hb"

    def ds_step() -> int:
        try:
            return int(json.loads(hb.read_text())["step"])
        except (OSError, ValueError, KeyError):
            return -1

    wait(lambda: ds_step() >= kill_at or ds.poll() is not None, 900, "DeepSpeed kill step")
    finished = ds_step()
    victim = rank_pid(ds.pid, 1)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    kill_tree(ds)
    ds_resume = latest_step(ckpt) or 0
    ds_again, ds_again_log = deepspeed(work, "ds-kill", [], ckpt, attempt=2)
    assert ds_again.wait(900) == 0, ds_again_log.read_text()[-3000:]
    ds_equal = final_hash(ds_again_log) == final_hash(ds_ref_log)

    rows = [
        {"case": "DDP, rank 1 kill -9, JIT checkpoint (checkpoint every 10 steps)", "kills": kills,
         "steps_lost": lost_jit, "max_steps_lost": max(lost_jit), "final_hash_equal": resumed_equal},
        {"case": "DDP, same kills, periodic checkpoint only (what it would have lost)", "kills": kills,
         "steps_lost": lost_periodic, "max_steps_lost": max(lost_periodic), "final_hash_equal": None},
        {"case": "ZeRO-3 (DeepSpeed, CPU), rank 1 kill -9, periodic every 3 steps (no JIT: sharded state)",
         "kills": 1, "steps_lost": [finished - ds_resume], "max_steps_lost": finished - ds_resume,
         "final_hash_equal": ds_equal},
    ]
    goals = [Goal("DDP steps lost per worker kill (max over kills, JIT)", max(lost_jit), "<=", 1, "steps"),
             Goal("ZeRO-3 steps lost per worker kill <= periodic interval", finished - ds_resume, "<=", 3, "steps"),
             Goal("resumed runs end bitwise equal (DDP JIT and ZeRO-3)", int(bool(resumed_equal and ds_equal)), "==", 1)]
    return rows, goals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one DDP kill instead of SPX_BENCH_KILLS (default 3)")
    args = ap.parse_args()
    seed = int(os.environ.get("SPX_BENCH_SEED", time.time_ns() % 10_000))
    rnd = random.Random(seed)
    kills = 1 if args.quick else int(os.environ.get("SPX_BENCH_KILLS", "3"))
    tier, tier_goals, how = tier_rows()
    with tempfile.TemporaryDirectory(prefix="spx-bench-jit-") as work:
        lost, lost_goals = steps_lost_rows(Path(work), kills, rnd)
    rows = [*tier, *lost, {"case": "notes", "throttle": how, "seed": seed}]
    path = write_result("checkpoint_tiers", rows, [*tier_goals, *lost_goals])
    for row in rows:
        print(json.dumps(row))
    for g in [*tier_goals, *lost_goals]:
        print(f"{'met' if g.met else 'MISSED'}: {g.name}: {g.value} {g.op} {g.target}")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
