"""The local checkpoint tier in one process (world of one): every checkpoint is written to the
host-local dir first and replicated to the persistent dir (both complete by the same rule, both
pruned by `keep`); a resume on the same host loads the local copy (and replicates it if the attempt
that wrote it did not), and the persistent copy when the local dir is gone (host loss) or torn —
each ending bitwise where an uninterrupted run ends."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import EXAMPLES
from spx.daemon.contract import checkpoint_layout as layout
from spx.daemon.contract.worker_env import ENV_LOCAL_CHECKPOINT_DIR
from spx.trainer import Preempted, Trainer, TrainerConfig

sys.path.insert(0, str(EXAMPLES))
from tinylm import SIZES, MarkovCorpus, TinyLM  # noqa: E402

pytestmark = pytest.mark.slow  # six in-process training runs, ~45 s on 2 cores

STEPS = 17


def _fit(ckpt: Path, stop_at: int | None = None) -> str | None:
    trainer = Trainer(TrainerConfig(max_steps=STEPS, seed=3, checkpoint_dir=str(ckpt), checkpoint_every_steps=4,
                                    keep=2, handle_sigterm=False, log_every_steps=0))
    lm = SIZES["tiny"]
    model = trainer.wrap(TinyLM(lm))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = trainer.dataloader(MarkovCorpus(40, lm.seq_len, lm.vocab, seed=2), batch_size=4)

    def on_step(t, step, loss):
        if step == stop_at:
            t.stop_flag.request()

    try:
        trainer.fit(model, opt, loader, on_step=on_step)
        return trainer.state_sha256()
    finally:
        trainer.close()


def _steps(d: Path) -> list[int]:
    return [r.step for r in layout.complete_checkpoints(d)]


@pytest.fixture
def reference(tmp_path, monkeypatch) -> str:
    monkeypatch.delenv(ENV_LOCAL_CHECKPOINT_DIR, raising=False)
    digest = _fit(tmp_path / "reference")
    assert digest is not None
    return digest


def test_checkpoints_land_in_both_tiers_and_resume_prefers_the_local_copy_then_the_persistent(
        tmp_path, monkeypatch, caplog, reference):
    caplog.set_level(logging.INFO, logger="spx.trainer")
    persistent, local = tmp_path / "persistent", tmp_path / "local"
    monkeypatch.setenv(ENV_LOCAL_CHECKPOINT_DIR, str(local))
    with pytest.raises(Preempted):
        _fit(persistent, stop_at=10)
    # keep=2 in each tier; the preemption checkpoint of step 10 is in both, byte for byte.
    assert _steps(local) == _steps(persistent) == [8, 10]
    for step in (8, 10):
        name = layout.step_dirname(step)
        assert (local / name / layout.MANIFEST).read_bytes() == (persistent / name / layout.MANIFEST).read_bytes()
        assert layout.verify_checksums(persistent / name)
    assert f"checkpoints go to {local} first, replicated to {persistent}" in caplog.text

    # Same host: the local copy (RAM) is the one loaded; the run still ends where the reference does.
    shutil.copytree(persistent, tmp_path / "persistent-at-10")
    shutil.copytree(local, tmp_path / "local-at-10")
    caplog.clear()
    assert _fit(persistent) == reference
    assert f"latest complete checkpoint: {local / 'step-000000010'} (local tier)" in caplog.text

    # The attempt that wrote the local copy was killed before its replica was made (torchrun stops
    # the other ranks when one fails): the resume from the local copy makes it.
    shutil.rmtree(persistent)
    shutil.rmtree(local)
    shutil.copytree(tmp_path / "persistent-at-10", persistent)
    shutil.rmtree(persistent / "step-000000010")
    shutil.copytree(tmp_path / "local-at-10", local)
    caplog.clear()
    assert _fit(persistent) == reference
    assert f"latest complete checkpoint: {local / 'step-000000010'} (local tier)" in caplog.text
    assert f"checkpoint step-000000010 replicated to {persistent} in" in caplog.text

    # Host loss: no local dir; the persistent copy is loaded (and the local tier starts afresh).
    shutil.rmtree(persistent)
    shutil.rmtree(local)
    shutil.copytree(tmp_path / "persistent-at-10", persistent)
    caplog.clear()
    assert _fit(persistent) == reference
    assert f"latest complete checkpoint: {persistent / 'step-000000010'} (persistent tier)" in caplog.text

    # A torn local copy (a file cut short) never counts: the persistent copy is loaded.
    shutil.rmtree(persistent)
    shutil.rmtree(local)
    shutil.copytree(tmp_path / "persistent-at-10", persistent)
    shutil.copytree(tmp_path / "local-at-10", local)
    model = local / "step-000000010" / "model.pt"
    model.write_bytes(model.read_bytes()[:100])
    caplog.clear()
    assert _fit(persistent) == reference
    assert f"latest complete checkpoint: {persistent / 'step-000000010'} (persistent tier)" in caplog.text


def test_a_local_dir_without_room_is_skipped(tmp_path, monkeypatch, caplog):
    """A tmpfs too small for keep + 1 checkpoints: every save goes straight to the persistent dir."""
    caplog.set_level(logging.INFO, logger="spx.trainer")
    local = Path("/dev/shm") / f"spx-test-tiny-{tmp_path.name}"
    local.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(local)], check=True)
        try:
            monkeypatch.setenv(ENV_LOCAL_CHECKPOINT_DIR, str(local))
            _fit(tmp_path / "persistent")
            assert "lacks room" in caplog.text
            assert _steps(tmp_path / "persistent") == [16, 17] and not list(local.iterdir())
        finally:
            subprocess.run(["umount", str(local)], check=True)
    finally:
        local.rmdir()
