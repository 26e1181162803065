"""The trainer's half of a divergence rollback, with real torchrun process groups (2 ranks, gloo on
CPU): rank 0's batch of step 37 is poisoned (its loss is NaN). The run stops at step 37 with a
"diverged" heartbeat and exit status 65 on its ranks, having checkpointed nothing of that step;
resumed from checkpoint 30 with SPX_SKIP_STEPS=31-37 (what the daemon's rollback sets) it succeeds,
and its final model is bitwise equal to a run that skipped the same steps from the start. The skip
ranges live on in its checkpoints: resumed from one of them without the variable, it still skips."""

from __future__ import annotations

import pytest
from trainer_runs import start_ddp

from spx.daemon.contract import checkpoint_layout as layout
from spx.daemon.contract.worker_env import ENV_SKIP_STEPS, EXIT_DIVERGED, read_heartbeat

pytestmark = pytest.mark.slow

POISON = ("--poison-step", "37", "--steps", "50")


def test_a_nan_loss_stops_the_run_and_a_resume_that_skips_its_data_matches_a_run_that_never_saw_it(tmp_path):
    run = start_ddp(tmp_path, "diverging", *POISON)
    assert run.wait() != 0, run.output()[-3000:]
    assert f"exitcode  : {EXIT_DIVERGED}" in run.output()
    beat = read_heartbeat(run.heartbeat)
    assert beat is not None and beat.status == "diverged" and beat.step == 37, beat
    assert beat.diverged is not None and beat.diverged.describe() == "loss NaN" and beat.diverged.step == 37
    assert layout.latest_complete(run.ckpt).step == 30  # nothing of step 37 (or later) was published

    rolled_back = start_ddp(tmp_path, "diverging", *POISON, attempt=2, ckpt=run.ckpt, env={ENV_SKIP_STEPS: "31-37"})
    assert rolled_back.wait() == 0, rolled_back.output()[-3000:]
    out = rolled_back.output()
    assert f"resumed from {run.ckpt / 'step-000000030'}: step 30" in out
    assert "skipping the data of steps 31-37" in out

    reference = start_ddp(tmp_path, "skipped-from-the-start", *POISON, env={ENV_SKIP_STEPS: "31-37"})
    assert reference.wait() == 0, reference.output()[-3000:]
    assert rolled_back.final_hash() == reference.final_hash()

    # The ranges are in the checkpoints written since: a resume without the variable keeps skipping.
    again = start_ddp(tmp_path, "diverging", *POISON, "--steps", "60", attempt=3, ckpt=run.ckpt)
    assert again.wait() == 0, again.output()[-3000:]
    assert "resumed from" in again.output() and "skipping the data of steps 31-37" in again.output()
