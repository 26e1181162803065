"""Bring your own checkpoints: scripts that save their library's way are resumed from their latest
COMPLETE checkpoint with no `checkpoints.pattern`, on the real daemon.

One daemon runs every layout at once (transformers' Trainer, DeepSpeed's save_checkpoint,
Lightning's ModelCheckpoint, torch.distributed.checkpoint, the seed's and nanoGPT's torch.save),
each crashing once after a few checkpoints (tests/fixtures/scripts/byo_checkpoints.py), most
leaving a torn newer checkpoint as a kill mid-save does; and a seed-style job whose newest
checkpoint crashes every load, for the crash-loop fallback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness import Daemon

SCRIPT = Path(__file__).resolve().parent.parent / "fixtures" / "scripts" / "byo_checkpoints.py"
PY = sys.executable

# layout arg, extra args, the checkpoint attempt 2 must resume from, the layout recognised,
# {skipped candidate: a piece of its reason}
CASES = {
    "seed": ("seed", ["--tear"], "checkpoint_epoch0_step4.pt", "epoch-step",
             {"checkpoint_epoch0_step6.pt": "no zip central directory"}),
    "nanogpt": ("nanogpt", [], "ckpt.pt", "nanogpt", {}),
    "dcp": ("dcp", ["--tear"], "step_4", "dcp", {"step_6": "no .metadata"}),
    "hf": ("hf", ["--tear"], "checkpoint-4", "hf-trainer", {"checkpoint-6": "no trainer_state.json"}),
    "deepspeed": ("deepspeed", ["--tear"], "global_step4", "deepspeed",
                  {"global_step6": "newer than the `latest` tag (global_step4)"}),
    "lightning": ("lightning", [], "last.ckpt", "lightning", {}),
}


def job(name: str, layout: str, extra: list[str], record: Path) -> str:
    argv = ", ".join(f'"{a}"' for a in ("--layout", layout, "--record", str(record), *extra))
    return (f"name: {name}\nlauncher: python\nscript: {SCRIPT}\npython: {PY}\nargs: [{argv}]\n"
            "restart: {max_restarts: 5, backoff_seconds: [1, 2]}\nstop: {grace_seconds: 5}\n")


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path / "root").start()
    yield d
    d.stop()


@pytest.mark.slow(seconds=145)
def test_each_layout_resumes_from_its_latest_complete_checkpoint_and_a_crash_loop_falls_back_once(daemon, tmp_path):
    for name, (layout, extra, *_rest) in CASES.items():
        daemon.drop(f"{name}.yaml", job(f"byo-{name}", layout, extra, tmp_path / f"{name}.jsonl"))
    daemon.drop("poison.yaml", job("byo-poison", "seed", ["--poison"], tmp_path / "poison.jsonl"))
    daemon.drop("fresh.yaml", job("byo-fresh", "nanogpt", [], tmp_path / "fresh.jsonl").replace(
        "max_restarts: 5", "max_restarts: 0"))
    ckpts = daemon.checkpoint_dir("x").parent

    for name, (_layout, _extra, expected, recognised, skipped) in CASES.items():
        daemon.wait_state(f"byo-{name}", {"succeeded", "failed"}, 240)
        st = daemon.status(f"byo-{name}")
        assert st["state"] == "succeeded", (name, st)
        first, second = records(tmp_path / f"{name}.jsonl")
        assert first == {"attempt": 1, "resume_from": None}
        assert second == {"attempt": 2, "resume_from": str(ckpts / f"byo-{name}" / expected)}, name
        found = st["history"][1]["checkpoint"]
        assert found["layout"] == recognised and found["path"] == second["resume_from"], (name, found)
        why = {s["name"]: s["why"] for s in found["skipped"]}
        assert set(why) == set(skipped), (name, why)
        for candidate, piece in skipped.items():
            assert piece in why[candidate], (name, why)
        log2 = (daemon.root / "log" / f"byo-{name}" / "attempt-2.log").read_text()
        assert "loaded " + second["resume_from"] in log2, log2[-2000:]

    # The torn HF checkpoint is named in `spx status`, with the reason it was passed over.
    text = daemon.spx("status", "byo-hf").stdout
    assert "checkpoint: resumed from" in text and "checkpoint-4 (step 4), layout hf-trainer" in text
    assert "skipped checkpoint-6 (hf-trainer): no trainer_state.json (the Trainer writes it last)" in text

    # Crash loop: attempts 2 and 3 resume from the poisoned step 6 and die loading it; attempt 4
    # falls back to step 4, once, and says so.
    daemon.wait_state("byo-poison", {"succeeded", "failed"}, 120)
    st = daemon.status("byo-poison")
    poisoned, good = (str(ckpts / "byo-poison" / f"checkpoint_epoch0_step{s}.pt") for s in (6, 4))
    assert [r["resume_from"] for r in records(tmp_path / "poison.jsonl")] == [None, poisoned, poisoned, good]
    assert st["state"] == "succeeded", st
    fallback = st["history"][3]["checkpoint"]
    assert fallback["fallback_from"] == poisoned and fallback["path"] == good
    assert fallback["fallback_why"] == "crash loop: attempts 2 and 3 resumed from it and failed"
    event = daemon.wait_event("resume_fallback", 5, job="byo-poison")
    assert event["attempt"] == 4 and event["passed_over"] == poisoned and event["resume_from"] == good
    text = daemon.spx("status", "byo-poison").stdout
    assert f"fell back from {poisoned}: crash loop" in text

    # No checkpoint at all: the attempt's record says it started fresh, and nothing was skipped.
    daemon.wait_state("byo-fresh", {"succeeded", "failed"}, 60)
    found = daemon.status("byo-fresh")["history"][0]["checkpoint"]
    assert found["path"] is None and found["skipped"] == [] and found["layout"] is None
    assert "checkpoint: no complete checkpoint; started fresh" in daemon.spx("status", "byo-fresh", check=False).stdout
