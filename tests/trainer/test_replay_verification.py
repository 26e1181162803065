"""Replay verification with real torchrun process groups (2 ranks, gloo on CPU): a run records each
checkpoint's interval (`replay.json`); a second run of the same command with SPX_REPLAY trains the
chain again from the records, reads the checkpoint dir without touching it, and says in its last
heartbeat whether every step's numbers and the state hashes came out the same. A run whose rank 1
computed one wrong gradient value at step 25 (as a faulty GPU would) is named: step 25, rank 1."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from trainer_runs import start_ddp

from spx.daemon.contract import checkpoint_layout as layout
from spx.daemon.contract.worker_env import ENV_REPLAY, read_heartbeat
from spx.trainer.replay_chain import RECORD, read_record

pytestmark = pytest.mark.slow

RUN = ("--steps", "40", "--checkpoint-every", "10")


def listing(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry under `root` with its size, mtime (ns) and mode: what a replay must leave alone."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(dirpath, name)
            st = path.lstat()
            out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns, st.st_mode)
    return out


def replay(tmp_path: Path, name: str, ckpt: Path, since: str = ""):
    """The same command as the original, as a replay with its own heartbeat; its verdict."""
    before = listing(ckpt)
    run = start_ddp(tmp_path, f"{name}-replay", *RUN, ckpt=ckpt, attempt=1, env={ENV_REPLAY: since})
    assert run.wait() == 0, run.output()[-3000:]
    assert listing(ckpt) == before, "the replay changed the checkpoint dir"
    beat = read_heartbeat(run.heartbeat)
    assert beat is not None and beat.status == "replayed" and beat.replay is not None, beat
    assert "replay verdict: " in run.output()
    return beat.replay, run


def test_a_healthy_run_replays_bit_for_bit_and_the_checkpoint_dir_is_untouched(tmp_path):
    run = start_ddp(tmp_path, "healthy", *RUN)
    assert run.wait() == 0, run.output()[-3000:]
    kept = [ref.step for ref in layout.complete_checkpoints(run.ckpt)]
    assert kept == [20, 30, 40]  # keep 3
    record = read_record(run.ckpt / "step-000000030")
    assert record is not None and record.from_step == 20 and record.world_size == 2
    assert [s[0] for s in record.steps] == list(range(21, 31))
    assert all(len(s[3]) == 2 and isinstance(s[1], float) for s in record.steps)
    manifest = layout.read_manifest(run.ckpt / "step-000000030")
    assert manifest is not None and RECORD in {f["path"] for f in manifest["files"]}  # checksummed with the rest

    verdict, replayed = replay(tmp_path, "healthy", run.ckpt)
    assert verdict.verified is True, verdict
    assert (verdict.from_step, verdict.to_step) == (20, 40)
    assert verdict.intervals == ((20, 30), (30, 40)) and verdict.step is None and verdict.reason is None
    assert f"replaying from checkpoint {run.ckpt / 'step-000000020'}" in replayed.output()

    verdict, _ = replay(tmp_path, "healthy-since", run.ckpt, since="35")
    assert verdict.verified is True and verdict.intervals == ((30, 40),), verdict


def test_a_wrong_gradient_on_rank_1_is_found_at_its_step_and_rank(tmp_path):
    run = start_ddp(tmp_path, "faulty", *RUN, "--keep", "10", "--corrupt-grad-step", "25", "--corrupt-grad-rank", "1")
    assert run.wait() == 0, run.output()[-3000:]
    assert "injected gradient error at step 25 on rank 1" in run.output()
    assert [ref.step for ref in layout.complete_checkpoints(run.ckpt)] == [10, 20, 30, 40]
    assert read_record(run.ckpt / "step-000000010").from_step is None  # from scratch

    verdict, replayed = replay(tmp_path, "faulty", run.ckpt)
    assert "injected gradient error" not in replayed.output()  # a replay never injects faults
    assert verdict.verified is False, verdict
    assert (verdict.step, verdict.metric, verdict.rank) == (25, "rank_grad_norm", 1), verdict
    assert verdict.from_step is None and verdict.to_step == 40
    assert verdict.intervals == ((0, 10), (10, 20))
    assert isinstance(verdict.expected, float) and isinstance(verdict.got, float) and verdict.expected != verdict.got
    doc = json.loads(replayed.heartbeat.read_text())["replay"]
    assert doc["metric"] == "rank_grad_norm" and doc["rank"] == 1 and doc["intervals"] == [[0, 10], [10, 20]]
