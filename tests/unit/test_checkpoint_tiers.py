"""Which tier a resume loads from (spx.daemon.contract.checkpoint_tiers): the host-local copy when
it is complete and not older than the persistent one, else the persistent copy; a torn local copy
or a missing local dir (host loss) never counts. Real directories, written by the trainer's own
publish (torch-free)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from spx.daemon.contract import checkpoint_tiers as tiers
from spx.daemon.contract.checkpoint_layout import tmp_dirname
from spx.trainer import layout_writer


def publish(ckpt_dir: Path, step: int, payload: bytes = b"weights") -> Path:
    staging = ckpt_dir / tmp_dirname(step, "t")
    staging.mkdir(parents=True)
    (staging / "model.pt").write_bytes(payload)
    manifest = layout_writer.build_manifest(staging, step=step, epoch=0, world_size=1, fmt="spx-ddp")
    final = layout_writer.publish(staging, manifest)
    assert final is not None
    return final


def test_prefer_rule():
    assert tiers.prefer(20, 10) == tiers.LOCAL
    assert tiers.prefer(20, 20) == tiers.LOCAL
    assert tiers.prefer(10, 20) == tiers.PERSISTENT
    assert tiers.prefer(None, 20) == tiers.PERSISTENT
    assert tiers.prefer(20, None) == tiers.LOCAL
    assert tiers.prefer(None, None) is None


def test_local_newer_is_chosen_and_equal_steps_load_from_local(tmp_path):
    persistent, local = tmp_path / "persistent", tmp_path / "local"
    publish(persistent, 10)
    publish(local, 10)
    choice = tiers.latest_complete(persistent, local)
    assert (choice.tier, choice.ref.path) == (tiers.LOCAL, local / "step-000000010")
    publish(local, 20)  # its replica is still in flight
    choice = tiers.latest_complete(persistent, local)
    assert (choice.tier, choice.ref.step) == (tiers.LOCAL, 20)
    discovery, tier = tiers.discover_tiers(persistent, local)
    assert tier == tiers.LOCAL and discovery.chosen.path == local / "step-000000020"


def test_persistent_newer_or_local_missing_or_torn_loads_the_persistent_copy(tmp_path):
    persistent, local = tmp_path / "persistent", tmp_path / "local"
    publish(persistent, 30)
    publish(local, 20)
    assert tiers.latest_complete(persistent, local).tier == tiers.PERSISTENT
    # Host loss: the local dir is not there at all.
    choice = tiers.latest_complete(persistent, tmp_path / "gone")
    assert (choice.tier, choice.ref.path) == (tiers.PERSISTENT, persistent / "step-000000030")
    assert tiers.discover_tiers(persistent, tmp_path / "gone")[1] == tiers.PERSISTENT
    # A torn local copy of a newer step: its manifest lists a size the file does not have.
    torn = publish(local, 40)
    (torn / "model.pt").write_bytes(b"half")
    choice = tiers.latest_complete(persistent, local)
    assert (choice.tier, choice.ref.step) == (tiers.PERSISTENT, 30)
    discovery, tier = tiers.discover_tiers(persistent, local)
    assert tier == tiers.PERSISTENT and discovery.chosen.step == 30
    # No manifest at all (a crash before the rename leaves only a staging dir): never counts either.
    staging = local / tmp_dirname(50, "x")
    staging.mkdir()
    (staging / "model.pt").write_bytes(b"w")
    assert tiers.latest_complete(persistent, local).ref.step == 30


def test_neither_tier_complete_and_pattern_jobs_use_the_persistent_dir_only(tmp_path):
    persistent, local = tmp_path / "persistent", tmp_path / "local"
    persistent.mkdir()
    assert tiers.latest_complete(persistent, local) == tiers.TierChoice(None, None)
    publish(local, 10)
    (persistent / "ckpt.pt").write_bytes(b"not a zip")
    discovery, tier = tiers.discover_tiers(persistent, local, pattern="ckpt.pt")
    assert tier is None and discovery.chosen is None
    assert json.dumps(discovery.to_json())  # what userfs sends back stays serialisable


def test_a_checkpoint_excluded_in_one_tier_is_excluded_in_both(tmp_path):
    """The crash-loop fallback passes over the checkpoint the job died on: its replica in the other
    tier is the same state, so the next older complete one is chosen."""
    persistent, local = tmp_path / "persistent", tmp_path / "local"
    for step in (10, 20):
        publish(persistent, step)
        publish(local, step)
    poisoned = {str(local / "step-000000020"): "the job crashed twice on it"}
    discovery, tier = tiers.discover_tiers(persistent, local, exclude=poisoned)
    assert tier == tiers.LOCAL and discovery.chosen.path == local / "step-000000010"
    shutil.rmtree(local)
    discovery, tier = tiers.discover_tiers(persistent, local, exclude=poisoned)
    assert tier == tiers.PERSISTENT and discovery.chosen.path == persistent / "step-000000010"
