"""A divergence, detected and rolled back, with a real daemon and a 2-rank DDP job on CPU (gloo):
rank 0's batch of step 37 is poisoned (examples' --poison-step: its loss is NaN in every attempt
that trains it). spx.trainer stops at step 37 with a "diverged" heartbeat; the daemon classes the
attempt `divergence`, relaunches it from checkpoint 30 with the data of steps 31-37 skipped, and the
job succeeds with a model bitwise equal to a job that skipped those steps from the start (--skip-steps).
With a second poisoned step (45) and `max: 1`, the rolled-back attempt diverges again and the job
fails with the evidence."""

from __future__ import annotations

import sys

import pytest

from harness import EXAMPLES, Daemon

PY = sys.executable

pytestmark = pytest.mark.slow


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path / "root").start()
    yield d
    d.stop()


def job_text(name: str, *extra: str, restart: str = "") -> str:
    argv = ", ".join(f'"{a}"' for a in ("--batch_size", "8", "--model-size", "tiny", "--seed", "1234", "--steps", "50",
                                        "--checkpoint-every", "10", "--poison-step", "37", *extra))
    return (f"name: {name}\nlauncher: torchrun\nscript: {EXAMPLES / 'train_ddp.py'}\npython: {PY}\n"
            f"args: [{argv}]\ngpus: 0\nprocs: 2\nrestart: {{max_restarts: 5, backoff_seconds: [1, 1]{restart}}}\n"
            "stop: {grace_seconds: 20}\n")


def test_a_nan_at_step_37_rolls_back_to_checkpoint_30_skipping_31_to_37_and_matches_a_run_that_skipped_them(daemon):
    daemon.drop("nan.yaml", job_text("nan37"))
    daemon.drop("ref.yaml", job_text("skipped", "--skip-steps", "31-37"))
    daemon.wait_state("nan37", "succeeded", 400)
    daemon.wait_state("skipped", "succeeded", 400)
    st = daemon.status("nan37")
    first, second = st["history"]
    assert (first["reason_class"], first["reason"], first["max_step"]) == (
        "divergence", "diverged at step 37: loss NaN", 37), first
    assert second["resumed_from_step"] == 30, second
    assert [a["reason_class"] for a in daemon.status("skipped")["history"]] == [None]
    text = daemon.spx("status", "nan37").stdout
    assert "rolled back from step 37 (loss NaN) to checkpoint 30, skipping batches 31–37" in text, text
    assert "at or after step 37, where training diverged" not in text  # no checkpoint after 30 was written
    assert daemon.final_hash("nan37", 2) == daemon.final_hash("skipped", 1)


def test_a_job_that_diverges_again_after_max_rollbacks_fails_with_the_evidence(daemon):
    daemon.drop("again.yaml", job_text("again", "--poison-step", "45",
                                       restart=", on_failure: {divergence: {max: 1, rollback: true}}"))
    daemon.wait_state("again", "failed", 400)
    st = daemon.status("again")
    assert [(a["reason_class"], a["resumed_from_step"]) for a in st["history"]] == [
        ("divergence", None), ("divergence", 30)], st["history"]
    assert st["reason"] == ("gave up: diverged at step 45: loss NaN, after 1 earlier divergence failure "
                            "(restart.on_failure.divergence.max: 1)"), st["reason"]
