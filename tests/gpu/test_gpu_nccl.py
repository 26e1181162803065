"""Training on the real GPUs through NCCL: `spx.trainer` picks nccl, one CUDA device per rank and
bf16 autocast; `examples/train_ddp.py` crashed at step 12 resumes from its latest complete
checkpoint and ends bitwise identical to an uninterrupted run.

World size N = the GPUs torch sees (CUDA_VISIBLE_DEVICES applies), at most 8.

    bash tests/run.sh tests/gpu -rs
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from gpu_support import Finished, torchrun

from harness import EXAMPLES
from spx.daemon.contract import checkpoint_layout as layout

PROBE = Path(__file__).resolve().parent / "ddp_backend_probe.py"
TRAIN = EXAMPLES / "train_ddp.py"
MAX_WORLD = 8

# Checkpoints at 5, 10, 15 (and the final one at 20); the crash at 12 leaves 10 as the latest.
STEPS, EVERY, CRASH_AT = 20, 5, 12
ARGS = ["--batch_size", "8", "--model-size", "tiny", "--seed", "1234", "--steps", str(STEPS),
        "--checkpoint-every", str(EVERY), "--dataset-size", "256", "--gradient_checkpointing"]
# The trainer sets this itself (setdefault, before cuBLAS starts) when TrainerConfig.deterministic
# is on, the default; set here as well so the runs do not depend on that ordering.
DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
NONDETERMINISM_WARNING = re.compile(r"^.*(?:does not have a deterministic implementation|non-?deterministic).*$", re.I | re.M)


@pytest.fixture(scope="module")
def world(cuda_torch) -> int:
    return min(cuda_torch["count"], MAX_WORLD)


def test_trainer_runs_nccl_on_one_cuda_device_per_rank_with_bf16_autocast(tmp_path, world, cuda_torch):
    run = torchrun(PROBE, [str(tmp_path / "ckpt")], nproc=world, work=tmp_path, name="probe",
                   env={"NCCL_DEBUG": "VERSION"}, timeout=300)
    assert run.returncode == 0, run.tail()
    reports = sorted((json.loads(m) for m in re.findall(r"SPX_PROBE (\{.*\})$", run.output(), re.M)),
                     key=lambda r: r["rank"])
    assert [r["rank"] for r in reports] == list(range(world)), run.tail()
    for r in reports:
        assert r["world"] == world
        assert r["backend"] == "nccl", f"rank {r['rank']} trained on {r['backend']}"
        assert r["device"] == f"cuda:{r['rank']}", f"rank {r['rank']} on {r['device']}"
        assert r["bf16"] is cuda_torch["bf16"], f"bf16 autocast {r['bf16']} on a GPU whose bf16 support is {cuda_torch['bf16']}"
        want = "torch.bfloat16" if cuda_torch["bf16"] else "torch.float32"
        assert r["forward_dtypes"] == [want], f"rank {r['rank']}: Linear outputs {r['forward_dtypes']} in the step"
        assert r["forward_devices"] == [r["device"]]
        assert r["param_dtypes"] == ["torch.float32"], "autocast keeps fp32 master weights"
        assert r["ddp"] is (world > 1) and r["steps"] == 3
        assert r["all_reduce"] == world, f"rank {r['rank']}: an all-reduce of 1 on {world} rank(s) gave {r['all_reduce']}"
    assert "NCCL version" in run.output(), "NCCL_DEBUG=VERSION printed no NCCL version: no NCCL communicator was made"


def nondeterminism_warnings(*runs: Finished) -> list[str]:
    return sorted({line.strip() for run in runs for line in NONDETERMINISM_WARNING.findall(run.output())})


def test_crash_at_step_12_resumes_from_the_latest_checkpoint_bitwise_identical_to_an_uninterrupted_run(tmp_path, world):
    """What is guaranteed, and checked here: same seed, same world size, same GPUs → the resumed
    run's final weights are bitwise those of the uninterrupted run. It rests on the trainer's
    deterministic mode (TrainerConfig.deterministic: `torch.use_deterministic_algorithms(True,
    warn_only=True)` and CUBLAS_WORKSPACE_CONFIG=:4096:8), on every rank's CUDA RNG state being in
    the checkpoint (dropout, also inside SDPA), and on NCCL reducing in the same order for the same
    world and message sizes. An op without a deterministic CUDA kernel only warns (warn_only), so
    on a mismatch the test runs the uninterrupted job a second time to tell "GPU runs are not
    reproducible at all" (the warnings are listed) from "resume is not exact".
    """
    reference = torchrun(TRAIN, ARGS, nproc=world, work=tmp_path, name="reference", env=DETERMINISTIC_ENV)
    assert reference.returncode == 0, reference.tail()
    ckpt = tmp_path / "crash-ckpt"
    crashed = torchrun(TRAIN, [*ARGS, "--crash-at-step", str(CRASH_AT)], nproc=world, work=tmp_path, name="crash",
                       ckpt=ckpt, env=DETERMINISTIC_ENV)
    assert crashed.returncode != 0, f"the run should have crashed at step {CRASH_AT}:\n{crashed.tail()}"
    assert f"injected crash at step {CRASH_AT}" in crashed.output(), crashed.tail()
    latest = layout.latest_complete(ckpt)
    # 10 unless the crash outran the asynchronous save of step 10 and close() could not finish it;
    # then the previous complete one (5) is the resume point, never a half-written one.
    assert latest is not None and latest.step in (CRASH_AT // EVERY * EVERY, CRASH_AT // EVERY * EVERY - EVERY), (
        f"latest complete checkpoint after a crash at step {CRASH_AT}: {latest}")

    resumed = torchrun(TRAIN, ARGS, nproc=world, work=tmp_path, name="crash", attempt=2, ckpt=ckpt, env=DETERMINISTIC_ENV)
    assert resumed.returncode == 0, resumed.tail()
    assert f"resumed from {latest.path}: step {latest.step}" in resumed.output(), resumed.tail()
    assert layout.latest_complete(ckpt).step == STEPS
    if resumed.final_hash() != reference.final_hash():
        again = torchrun(TRAIN, ARGS, nproc=world, work=tmp_path, name="reference-again", env=DETERMINISTIC_ENV)
        reproducible = again.returncode == 0 and again.final_hash() == reference.final_hash()
        warnings = nondeterminism_warnings(reference, crashed, resumed, again)
        pytest.fail(
            f"resumed from step {latest.step} on {world} GPU(s): final state differs from the uninterrupted run; "
            + ("two uninterrupted runs agree, so resume is not exact on GPU" if reproducible
               else "two uninterrupted runs differ too, so GPU training itself is not deterministic here")
            + (f"; nondeterminism warnings: {warnings}" if warnings else "; no nondeterminism warning was printed"))
