"""Exact resume with real torchrun process groups (gloo on CPU): kill -9 at a random step, in the
middle of an epoch and in the middle of a checkpoint write; SIGTERM at a random moment.

Every interrupted-and-resumed run must end with a model state bitwise identical to the
uninterrupted run of the same seed and world size. The random step is drawn from a seed printed in
the test output, so a failure can be replayed.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
from trainer_runs import STEPS_PER_EPOCH, kill9_everything, start_ddp

from harness import wait_for
from spx.daemon.contract import checkpoint_layout as layout
from spx.daemon.contract.worker_env import read_heartbeat

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("SPX_TEST_SEED", time.time_ns() % 10_000))


@pytest.fixture(scope="module")
def reference_hash(tmp_path_factory) -> str:
    run = start_ddp(tmp_path_factory.mktemp("reference"), "reference")
    assert run.wait() == 0, run.output()[-3000:]
    return run.final_hash()


@pytest.fixture
def rnd() -> random.Random:
    print(f"random seed {SEED} (replay with SPX_TEST_SEED={SEED})")
    return random.Random(SEED)


def resume_to_the_end(tmp_path, name: str, ckpt) -> tuple[str, str]:
    run = start_ddp(tmp_path, name, attempt=2, ckpt=ckpt)
    assert run.wait() == 0, run.output()[-3000:]
    return run.final_hash(), run.output()


def test_kill9_mid_epoch_at_a_random_step_resumes_bitwise_identical(tmp_path, reference_hash, rnd):
    kill_at = rnd.choice([s for s in range(12, 50) if s % STEPS_PER_EPOCH])
    run = start_ddp(tmp_path, "kill9", "--sleep-per-step", "0.2")
    run.wait_step(kill_at)
    kill9_everything(run)
    latest = layout.latest_complete(run.ckpt)
    assert latest is not None and latest.step % STEPS_PER_EPOCH, f"resume point {latest} should be mid-epoch"
    digest, out = resume_to_the_end(tmp_path, "kill9", run.ckpt)
    assert f"resumed from {latest.path}: step {latest.step}" in out
    assert digest == reference_hash, f"killed at step ≥{kill_at}, resumed from {latest.step}: state differs"


def test_kill9_on_four_ranks_resumes_bitwise_identical(tmp_path, rnd):
    """With more than two ranks the order of each element's sum in DDP's ring all-reduce depends on
    its place in the gradient buckets, which DDP lays out anew after a process's first backward: the
    resumed run's first step must use the uninterrupted run's layout (trainer/ddp.py, _shadow_backward)."""
    short = ("--steps", "40")  # 5 epochs of 8 steps on 4 ranks: keeps the three 4-rank runs under a minute
    reference = start_ddp(tmp_path, "reference4", *short, nproc=4)
    assert reference.wait() == 0, reference.output()[-3000:]
    kill_at = rnd.choice([s for s in range(12, 28) if s % 8])
    run = start_ddp(tmp_path, "kill9-4", *short, "--sleep-per-step", "0.1", nproc=4)
    run.wait_step(kill_at)
    kill9_everything(run)
    latest = layout.latest_complete(run.ckpt)
    assert latest is not None
    resumed = start_ddp(tmp_path, "kill9-4", *short, attempt=2, ckpt=run.ckpt, nproc=4)
    assert resumed.wait() == 0, resumed.output()[-3000:]
    assert resumed.final_hash() == reference.final_hash(), f"4 ranks, resumed from {latest.step}: state differs"
    assert "one backward without an update" in resumed.output()


def test_kill9_during_a_checkpoint_write_never_publishes_it_and_resumes_bitwise(tmp_path, reference_hash, rnd):
    # Each checkpoint's model file stays half-written for 2 s: kill the group inside that window.
    target = rnd.choice([20, 30, 40])
    run = start_ddp(tmp_path, "midwrite", "--debug-write-delay", "2")
    staging_part = run.ckpt / "placeholder"

    def half_written():
        nonlocal staging_part
        for p in run.ckpt.glob(f"{layout.step_dirname(target)}.tmp-*/model.pt.part"):
            staging_part = p
            return True
        run._died()
        return False

    wait_for(half_written, 120, f"checkpoint {target} being written")
    kill9_everything(run)
    assert staging_part.parent.exists(), "the staging directory of the killed save should still be there"
    latest = layout.latest_complete(run.ckpt)
    assert latest is not None and latest.step < target, f"half-written step {target} counted as latest: {latest}"
    assert layout.find_latest(run.ckpt).path == latest.path  # what the daemon would pass as SPX_RESUME_FROM
    digest, out = resume_to_the_end(tmp_path, "midwrite", run.ckpt)
    assert f"removed unfinished checkpoint {staging_part.parent.name}" in out
    assert not staging_part.parent.exists()
    assert digest == reference_hash


def test_sigterm_at_a_random_moment_checkpoints_that_step_and_the_resume_continues_from_it(
    tmp_path, reference_hash, rnd
):
    run = start_ddp(tmp_path, "sigterm", "--sleep-per-step", "0.2")
    run.wait_step(3)
    time.sleep(rnd.uniform(0.0, 2.0))  # any moment: mid-step, mid-save, between steps
    run.signal_all(signal.SIGTERM)  # what the daemon sends on cancel, systemctl stop or a spot reclaim
    run.wait(60)
    beat = read_heartbeat(run.heartbeat)
    assert beat is not None and beat.status == "preempted", run.output()[-3000:]
    latest = layout.latest_complete(run.ckpt)
    assert latest is not None and latest.step == beat.step, f"no checkpoint of the preempted step {beat.step}"
    assert f"preempted at step {beat.step}" in run.output()
    digest, out = resume_to_the_end(tmp_path, "sigterm", run.ckpt)
    assert f"resumed from {latest.path}: step {beat.step}" in out
    assert digest == reference_hash
