"""Whose checkpoint dir is whose: the default is `checkpoints_root/OWNER/NAME` (written into the spec
at intake), a spec from before keeps `checkpoints_root/NAME`; root makes only the component below its
own root; and no job (root's included) resumes from, or sets aside files in, a dir another user
controls (userfs.user_actions, run in this process as the test's user)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from spx.daemon.core.spec import default_checkpoint_dir, owner_component, parse_spec, root_made
from spx.daemon.userfs import user_actions

ROOT = Path("/checkpoints")
STRANGER = 54321


def test_the_default_dir_is_per_owner_and_written_into_the_spec():
    spec = parse_spec("name: llama\nscript: t.py\n")
    assert spec.checkpoint_dir(ROOT) == ROOT / "llama", "a spec accepted before per-owner dirs"
    pinned = spec.with_checkpoint_dir(ROOT, "alice", 1000)
    assert pinned.checkpoints.dir == ROOT / "alice" / "llama" == pinned.checkpoint_dir(ROOT)
    own = parse_spec("name: llama\nscript: t.py\ncheckpoints: {dir: /data/x}\n")
    assert own.with_checkpoint_dir(ROOT, "alice", 1000) is own
    assert owner_component("we/ird", 1002) == "uid-1002" and owner_component("..", 7) == "uid-7"
    assert default_checkpoint_dir(ROOT, "bob", 1001, "llama") == ROOT / "bob" / "llama"


def test_root_makes_only_the_one_component_below_its_own_root():
    assert root_made(ROOT, ROOT / "alice" / "llama", "alice", 1000) == ROOT / "alice"
    assert root_made(ROOT, ROOT / "alice" / "a" / "b", "alice", 1000) == ROOT / "alice"
    assert root_made(ROOT, ROOT / "llama", "alice", 1000) == ROOT / "llama", "a one-component dir (from before)"
    assert root_made(ROOT, ROOT / "bob" / "llama", "alice", 1000) is None, "bob's: made (or refused) as alice"
    assert root_made(ROOT, Path("/data/llama"), "alice", 1000) is None


def _old_checkpoint(ckpt: Path) -> None:
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "step-000000010").mkdir()
    os.utime(ckpt / "step-000000010", (1.0, 1.0))


def test_setting_aside_never_follows_a_link_planted_at_the_aside_dir(tmp_path):
    ckpt, elsewhere = tmp_path / "ckpt", tmp_path / "elsewhere"
    _old_checkpoint(ckpt)
    elsewhere.mkdir()
    os.symlink(elsewhere, ckpt / ".before-job-7")
    with pytest.raises(OSError):
        user_actions._set_aside({"dir": str(ckpt), "before": time.time(), "into": ".before-job-7"})
    assert os.listdir(elsewhere) == [] and (ckpt / "step-000000010").is_dir()
    os.unlink(ckpt / ".before-job-7")
    moved = user_actions._set_aside({"dir": str(ckpt), "before": time.time(), "into": ".before-job-7"})
    assert moved == ["step-000000010"] and (ckpt / ".before-job-7" / "step-000000010").is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_checkpoint_dir_another_user_owns_is_neither_resumed_from_nor_set_aside_in_root_included(tmp_path):
    theirs = tmp_path / "theirs"
    _old_checkpoint(theirs)
    os.chown(theirs, STRANGER, STRANGER)
    with pytest.raises(PermissionError, match="belongs to uid 54321"):
        user_actions._find_latest({"dir": str(theirs)})
    with pytest.raises(PermissionError, match="belongs to uid 54321"):
        user_actions._set_aside({"dir": str(theirs), "before": time.time(), "into": ".before-job-7"})
    assert sorted(os.listdir(theirs)) == ["step-000000010"]
    (problem,) = user_actions._access({"checks": [{"path": str(theirs), "what": "owned"}]})
    assert problem == f"{theirs} exists and belongs to uid {STRANGER}"
