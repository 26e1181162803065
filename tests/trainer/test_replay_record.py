"""The replay record in one process (world of one): a checkpoint of an older trainer (no
`replay.json`) still resumes and starts a replay chain; the record is bounded; a replay in the same
process verifies the intervals (own norm = global norm with one rank) and writes nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from harness import EXAMPLES
from spx.daemon.contract import checkpoint_layout as layout
from spx.daemon.contract.worker_env import ENV_REPLAY, read_heartbeat
from spx.trainer import Trainer, TrainerConfig
from spx.trainer.replay_chain import RECORD, read_record, replay_chain
from spx.trainer.replay_record import StepRecorder

sys.path.insert(0, str(EXAMPLES))
from tinylm import SIZES, MarkovCorpus, TinyLM  # noqa: E402


def _fit(ckpt: Path, steps: int, *, record: bool = True, hb: Path | None = None) -> None:
    trainer = Trainer(TrainerConfig(max_steps=steps, seed=5, checkpoint_dir=str(ckpt), checkpoint_every_steps=5,
                                    grad_accum_steps=2, max_grad_norm=1.0, handle_sigterm=False, log_every_steps=0,
                                    replay_record=record, heartbeat_file=str(hb) if hb else None, keep=10))
    lm = SIZES["tiny"]
    model = trainer.wrap(TinyLM(lm))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = trainer.dataloader(MarkovCorpus(40, lm.seq_len, lm.vocab, seed=2), batch_size=4)
    try:
        trainer.fit(model, opt, loader)
    finally:
        trainer.close()


def test_an_older_trainers_checkpoint_resumes_and_starts_the_chain_and_a_replay_verifies_it(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    _fit(ckpt, 10, record=False)  # as an older trainer: checkpoints 5 and 10 without records
    assert not (ckpt / "step-000000010" / RECORD).exists()
    _fit(ckpt, 20)
    record = read_record(ckpt / "step-000000015")
    assert record is not None and record.from_step == 10 and [s[0] for s in record.steps] == [11, 12, 13, 14, 15]
    assert all(s[3] == [s[2]] for s in record.steps)  # one rank: its own gradient is the global one
    assert read_record(ckpt / "step-000000020").from_step == 15
    chain = replay_chain(ckpt, None)
    assert chain.start == ckpt / "step-000000010" and chain.end_step == 20

    before = sorted((p.relative_to(ckpt), p.stat().st_mtime_ns) for p in ckpt.rglob("*"))
    monkeypatch.setenv(ENV_REPLAY, "oldest")
    hb = tmp_path / "replay.heartbeat"
    _fit(ckpt, 20, hb=hb)
    assert sorted((p.relative_to(ckpt), p.stat().st_mtime_ns) for p in ckpt.rglob("*")) == before
    beat = read_heartbeat(hb)
    assert beat.status == "replayed" and beat.replay.verified is True, beat
    assert beat.replay.intervals == ((10, 15), (15, 20)) and beat.replay.from_step == 10
    assert [ref.step for ref in layout.complete_checkpoints(ckpt)] == [5, 10, 15, 20]


def test_the_record_keeps_the_last_steps_and_its_start_moves_up_to_match():
    recorder = StepRecorder(torch.device("cpu"), world_size=1, from_step=None, capacity=4)
    for step in range(1, 7):
        recorder.step_done(step, torch.tensor(float(step)), torch.tensor(0.5), torch.tensor(0.25))
    start, steps = recorder.take(distributed=False)
    assert start == 2 and [s[0] for s in steps] == [3, 4, 5, 6]
    assert steps[0] == [3, 3.0, 0.5, [0.25]]
    recorder.from_step = 6
    recorder.step_done(7, torch.tensor(float("nan")), torch.tensor(1.0), torch.tensor(1.0))
    start, steps = recorder.take(distributed=False)
    assert start == 6 and len(steps) == 1 and steps[0][1] != steps[0][1]  # NaN kept as NaN


def test_a_replay_with_nothing_to_replay_says_why_and_creates_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_REPLAY, "")
    hb = tmp_path / "replay.heartbeat"
    _fit(tmp_path / "never-written", 20, hb=hb)
    assert not (tmp_path / "never-written").exists()
    beat = read_heartbeat(hb)
    assert beat.status == "replayed" and beat.step == 0 and beat.replay.verified is None
    assert "has a replay record" in beat.replay.reason
