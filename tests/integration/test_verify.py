"""Replay verification end to end (docs/verify.md): a real daemon on the fake 8×H100, a 2-rank DDP job
of examples/train_ddp.py (CPU, gloo) on fake GPUs 0 and 1, checkpointing every 10 steps, whose rank 1
computes one wrong gradient value at step 25 in its first attempt (`--corrupt-grad-step 25
--corrupt-grad-rank 1`: a faulty GPU's arithmetic, before DDP's all-reduce). `spx verify` replays its
checkpoint intervals on GPUs 2 and 3 while it trains: the verdict names step 25 and rank 1, so GPU 1
is suspect; the job is killed, its checkpoints from step 25 on are set aside, and it resumes from
checkpoint 20 and trains the same data again — its final model is bitwise equal to a run that never
had the fault. A second `spx verify --from 100`, of the job as it finished, verifies its last intervals."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness import EXAMPLES, Daemon, wait_for
from spx.daemon.gpu.fake import DEFAULT_FIXTURE

PY = sys.executable

pytestmark = pytest.mark.slow(seconds=95)


def fixture(tmp_path: Path) -> Path:
    doc = json.loads(DEFAULT_FIXTURE.read_text())
    for dev in doc["devices"]:
        dev["xid_schedule"] = []  # GPU 3's XID 79 would quarantine the replay's GPU
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(doc))
    return path


def job_text(name: str, *extra: str) -> str:
    argv = ", ".join(f'"{a}"' for a in ("--batch_size", "8", "--model-size", "tiny", "--seed", "1234", "--steps", "120",
                                        "--checkpoint-every", "10", "--keep", "20", *extra))
    return (f"name: {name}\nlauncher: torchrun\nscript: {EXAMPLES / 'train_ddp.py'}\npython: {PY}\n"
            f"args: [{argv}]\ngpus: 2\nrestart: {{max_restarts: 3, backoff_seconds: [1, 1]}}\n"
            "stop: {grace_seconds: 20}\n")


def test_a_gradient_computed_wrong_at_step_25_is_found_by_a_replay_named_and_rolled_back(tmp_path: Path):
    d = Daemon(tmp_path / "root", gpu_backend="fake", extra_args=["--fake-gpus", str(fixture(tmp_path))]).start()
    try:
        d.drop("faulty.yaml", job_text("faulty", "--sleep-per-step", "0.25", "--corrupt-grad-step", "25",
                                       "--corrupt-grad-rank", "1"))
        wait_for(lambda: (d.status("faulty").get("last_checkpoint_step") or 0) >= 30, 240, "checkpoint 30 of faulty")
        out = d.spx("verify", "faulty").stdout
        assert "faulty.verify: queued" in out or "faulty.verify: running" in out or "faulty.verify: starting" in out, out
        d.wait_state("faulty.verify", "succeeded", 300)
        st = d.status("faulty")
        [v] = st["verifications"]
        assert v["verified"] is False and v["suspect"] == 1 and v["trained_on"] == [0, 1], v
        assert v["verdict"]["step"] == 25 and v["verdict"]["rank"] == 1, v
        assert v["text"].startswith("differs at step 25: rank 1's gradient norm"), v
        gpus = {r["index"]: r for r in json.loads(d.spx("gpus", "--json").stdout)}
        assert gpus[1]["suspect"] and not gpus[1]["quarantine"] and not gpus[0]["suspect"], gpus[1]
        # The fault's attempt was stopped for it; the next resumed from checkpoint 20, after the
        # checkpoints from step 25 on were set aside.
        d.wait_state("faulty", "succeeded", 400)
        first, second = d.status("faulty")["history"][:2]
        assert first["reason_class"] == "corruption" and first["reason"].startswith(
            "a replay on other GPUs differs at step 25: rank 1's gradient norm"), first
        assert second["resumed_from_step"] == 20, second
        aside = d.checkpoint_dir("faulty") / ".replay-differs-at-25"
        assert "step-000000030" in {p.name for p in aside.iterdir()}, list(aside.iterdir())
        text = d.spx("status", "faulty").stdout
        print(text, d.spx("gpus").stdout, sep="\n")
        assert "verify: differs at step 25" in text and "the checkpoints from step 25 on set aside" in text, text
        # The same data trained again from checkpoint 20: the model a fault-free run ends with.
        d.drop("clean.yaml", job_text("clean"))
        d.wait_state("clean", "succeeded", 300)
        assert d.final_hash("faulty", len(d.status("faulty")["history"])) == d.final_hash("clean", 1)
        # A second replay, of the job as it finished (its last intervals): they verify.
        d.spx("verify", "faulty", "--from", "100")
        d.wait_state("faulty.verify", "succeeded", 300)
        latest = d.status("faulty")["verifications"][0]
        assert latest["verified"] is True and latest["verdict"]["intervals"] == [[100, 110], [110, 120]], latest
    finally:
        d.stop()
