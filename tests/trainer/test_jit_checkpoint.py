"""Just-in-time checkpoints with real torchrun / deepspeed process groups (gloo on CPU).

DDP: rank 1 is `kill -9`'d at a random step between two periodic checkpoints; the surviving rank
saves the last completed step before it exits, so at most one step is lost, and the run resumed
from it ends bitwise identical to an uninterrupted one. ZeRO-3 (state sharded, no JIT: at most the
periodic interval lost, bitwise-equal end) is checked on the runs test_deepspeed_resume.py already
makes, to keep DeepSpeed start-ups out of this file.

"The last completed step" is read from the boundary files every rank writes at each step, once its
forward is done and before its backward (spx.trainer.jit): the highest step any rank reached, one at
most past the last step a survivor finished.
"""

from __future__ import annotations

import os
import random
import re
import signal
import time
from pathlib import Path

import pytest
from trainer_runs import Run, start_ddp

from harness import wait_for
from spx.daemon.contract import checkpoint_layout as layout
from spx.daemon.run import proctree
from spx.trainer.jit import BOUNDARY_PREFIX

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("SPX_TEST_SEED", time.time_ns() % 10_000))
EVERY = 10
_BOUNDARY = re.compile(r"^rank-(\d{5})\.step-(\d{9})\.pt$")


def rank_pid(run: Run, rank: int) -> int:
    """The worker process of `rank` (its environment says RANK=rank; the launcher has no RANK)."""
    for pid in proctree.attempt_pids(run.tag):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"LOCAL_RANK=" + str(rank).encode() in env:
            return pid
    raise AssertionError(f"no worker of rank {rank} in {run.tag}")


def boundary_steps(ckpt: Path) -> dict[int, int]:
    """rank → the highest step it finished, from the boundary files of the (single) attempt."""
    best: dict[int, int] = {}
    for d in ckpt.glob(BOUNDARY_PREFIX + "*"):
        for f in d.iterdir():
            if m := _BOUNDARY.match(f.name):
                rank, step = int(m.group(1)), int(m.group(2))
                best[rank] = max(best.get(rank, 0), step)
    return best


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory) -> str:
    run = start_ddp(tmp_path_factory.mktemp("reference"), "reference")
    assert run.wait() == 0, run.output()[-3000:]
    return run.final_hash()


def test_ddp_rank_killed_between_checkpoints_loses_at_most_one_step_and_resumes_bitwise(tmp_path, ddp_reference):
    rnd = random.Random(SEED)
    kill_at = rnd.choice([s for s in range(12, 50) if 1 < s % EVERY < EVERY - 1])
    print(f"random seed {SEED} (replay with SPX_TEST_SEED={SEED}): rank 1 killed after step {kill_at}")
    run = start_ddp(tmp_path, "jit", "--sleep-per-step", "0.2")
    wait_for(lambda: boundary_steps(run.ckpt).get(1, 0) >= kill_at or run._died(), 180, f"rank 1 at step {kill_at}",
             interval=0.01)
    os.kill(rank_pid(run, 1), signal.SIGKILL)
    assert run.wait(60) != 0
    wait_for(lambda: not proctree.attempt_pids(run.tag), 30, "every process of the run to be gone")

    finished = max(boundary_steps(run.ckpt).values())
    latest = layout.latest_complete(run.ckpt)
    assert latest is not None, run.output()[-3000:]
    lost = finished - latest.step
    assert 0 <= lost <= 1, f"last completed step {finished}, resume point {latest.step}:\n{run.output()[-3000:]}"
    assert latest.step % EVERY, f"the resume point {latest.step} should be a JIT checkpoint between periodic ones"
    manifest = layout.read_manifest(latest.path)
    assert manifest["extra"]["jit"] is True and manifest["world_size"] == 2
    assert layout.verify_checksums(latest.path)
    assert f"JIT checkpoint {latest.path} published" in run.output()

    resumed = start_ddp(tmp_path, "jit", attempt=2, ckpt=run.ckpt)
    assert resumed.wait() == 0, resumed.output()[-3000:]
    assert f"resumed from {latest.path}: step {latest.step}" in resumed.output()
    assert resumed.final_hash() == ddp_reference, f"resumed from the JIT checkpoint of step {latest.step}: state differs"
    assert not list(run.ckpt.glob(BOUNDARY_PREFIX + "*")), "the resumed attempt sweeps the failed one's boundary files"


def test_ddp_rank_killed_inside_its_update_still_leaves_the_step_its_peer_finished(tmp_path, ddp_reference):
    """Rank 1 dies inside step K's optimizer update; rank 0 finishes that update. Rank 1's boundary
    file of step K was written before its backward, so the survivor publishes step K, and the run
    resumed from it ends bitwise as the uninterrupted one."""
    kill_at = random.Random(SEED).choice([s for s in range(12, 40) if 1 < s % EVERY < EVERY - 1])
    print(f"random seed {SEED} (replay with SPX_TEST_SEED={SEED}): rank 1 killed inside step {kill_at}'s update")
    run = start_ddp(tmp_path, "in-update", "--kill-in-update-at", str(kill_at))
    assert run.wait(180) != 0
    wait_for(lambda: not proctree.attempt_pids(run.tag), 30, "every process of the run to be gone")
    assert f"killed inside the update of step {kill_at}" in run.output()

    latest = layout.latest_complete(run.ckpt)
    assert latest is not None and latest.step == kill_at, \
        f"resume point {latest and latest.step}, the survivor finished step {kill_at}:\n{run.output()[-3000:]}"
    assert layout.read_manifest(latest.path)["extra"]["jit"] is True

    resumed = start_ddp(tmp_path, "in-update", attempt=2, ckpt=run.ckpt)
    assert resumed.wait() == 0, resumed.output()[-3000:]
    assert resumed.final_hash() == ddp_reference, f"resumed from the JIT checkpoint of step {kill_at}: state differs"
