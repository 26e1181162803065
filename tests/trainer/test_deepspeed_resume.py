"""DeepSpeed ZeRO-3 with the seed's ds_config unchanged (CPU offload of optimizer and parameters,
bf16, 8 accumulation steps) on 2 CPU ranks, supervised by the daemon: a worker killed with -9 after
a checkpoint, the job is relaunched from that DeepSpeed checkpoint and finishes with the state of an
uninterrupted run (the same script run directly, without the daemon).

One test for the trainer's DeepSpeed save/resume and the daemon's DeepSpeed launch and relaunch:
each DeepSpeed start costs ~12 s of this suite's time on 2 cores, so the checks share the runs."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest
from trainer_runs import DS_OPS_DIR, start_deepspeed

from harness import EXAMPLES, Daemon, job_pids, wait_for
from spx.daemon.contract import checkpoint_layout as layout

pytestmark = pytest.mark.slow(seconds=460)  # two JIT op builds on a fresh venv

ARGS = ("--steps", "9", "--checkpoint-every", "3")


def test_deepspeed_zero3_job_killed_once_resumes_from_its_checkpoint_with_the_uninterrupted_state(tmp_path):
    reference = start_deepspeed(tmp_path, "reference", *ARGS)
    assert reference.wait(600) == 0, reference.output()[-4000:]

    argv = ", ".join(f'"{a}"' for a in ("--model-size", "tiny", "--seed", "5", *ARGS, "--sleep-per-step", "1"))
    d = Daemon(tmp_path / "root", gpu_backend="fake").start()
    try:
        d.drop("ds.yaml", f"name: ds-job\nlauncher: deepspeed\nscript: {EXAMPLES / 'train_deepspeed.py'}\n"
                          f"python: {sys.executable}\ndeepspeed_config: {EXAMPLES / 'ds_config.json'}\n"
                          f"args: [{argv}]\ngpus: 2\nprocs: 2\nenv: {{TORCH_EXTENSIONS_DIR: {DS_OPS_DIR}}}\n"
                          "restart: {max_restarts: 2, backoff_seconds: [1, 5], hang_timeout_seconds: 600}\n")
        ckpt = d.checkpoint_dir("ds-job")
        wait_for(lambda: layout.latest_complete(ckpt), 600, "the first DeepSpeed checkpoint", interval=0.2)
        victims = [p for p in job_pids("ds-job")
                   if b"train_deepspeed.py" in Path(f"/proc/{p}/cmdline").read_bytes()
                   and b"deepspeed.launcher" not in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert victims
        killed_at = (d.job("ds-job") or {}).get("step") or 0
        os.kill(victims[-1], signal.SIGKILL)
        latest = layout.latest_complete(ckpt)
        assert latest is not None and latest.step < 9
        manifest = layout.read_manifest(latest.path)
        assert manifest["format"] == "spx-deepspeed" and manifest["world_size"] == 2
        shards = {f["path"] for f in manifest["files"]}
        assert {"engine/zero_pp_rank_0_mp_rank_00_model_states.pt", "engine/zero_pp_rank_1_mp_rank_00_model_states.pt",
                "rank-00000.pt", "rank-00001.pt"} <= shards, shards
        assert layout.verify_checksums(latest.path)
        # ZeRO-3 state is sharded: no JIT checkpoint (no per-step boundary files); the periodic one rules.
        assert "jit" not in manifest.get("extra", {}) and not list(ckpt.glob(".spx-boundary-*"))

        d.wait_state("ds-job", {"succeeded", "failed"}, 600)
        st = d.status("ds-job")
        assert st["state"] == "succeeded", st
        resumed = st["history"][-1]
        assert len(st["history"]) == 2 and resumed["resumed_from_step"] >= latest.step >= 3, st["history"]
        assert killed_at - resumed["resumed_from_step"] <= 3, "a kill loses at most the periodic interval"
        log = (d.root / "log" / "ds-job" / "attempt-2.log").read_text()
        assert f"resumed from {resumed['resumed_from']}: step {resumed['resumed_from_step']}" in log
        found = set(re.findall(r"final_state_sha256=([0-9a-f]{64})$", log, re.M))
        assert found == {reference.final_hash()}, "the relaunched job ends in the uninterrupted run's state"
    finally:
        d.stop()
