"""DeepSpeed ZeRO-3 with the seed's ds_config unchanged (CPU offload of optimizer and parameters,
bf16, 8 accumulation steps) on 2 CPU ranks: killed with -9 after a checkpoint, it resumes from
that DeepSpeed checkpoint and finishes with the uninterrupted run's state."""

from __future__ import annotations

import pytest
from trainer_runs import kill9_everything, start_deepspeed

from harness import wait_for
from spx.daemon.contract import checkpoint_layout as layout

pytestmark = pytest.mark.slow

ARGS = ("--steps", "9", "--checkpoint-every", "3")


def test_deepspeed_zero3_killed_once_resumes_from_its_checkpoint_and_finishes(tmp_path):
    reference = start_deepspeed(tmp_path, "reference", *ARGS)
    assert reference.wait(600) == 0, reference.output()[-4000:]

    run = start_deepspeed(tmp_path, "killed", *ARGS, "--sleep-per-step", "1")
    wait_for(lambda: (layout.latest_complete(run.ckpt) or run._died()), 300, "the first DeepSpeed checkpoint")
    kill9_everything(run)
    latest = layout.latest_complete(run.ckpt)
    assert latest is not None and latest.step < 9
    manifest = layout.read_manifest(latest.path)
    assert manifest["format"] == "spx-deepspeed" and manifest["world_size"] == 2
    shards = {f["path"] for f in manifest["files"]}
    assert {"engine/zero_pp_rank_0_mp_rank_00_model_states.pt", "engine/zero_pp_rank_1_mp_rank_00_model_states.pt",
            "rank-00000.pt", "rank-00001.pt"} <= shards, shards
    assert layout.verify_checksums(latest.path)

    resumed = start_deepspeed(tmp_path, "killed", *ARGS, attempt=2)
    assert resumed.wait(600) == 0, resumed.output()[-4000:]
    assert f"resumed from {latest.path}: step {latest.step}" in resumed.output()
    assert resumed.final_hash() == reference.final_hash()
