"""The torch-free checkpoint contract: what counts as complete, what is "latest"."""

import json
import zipfile

from spx.daemon.contract import checkpoint_layout as cl
from spx.trainer import layout_writer as lw


def make(ckpt_dir, step, payload=b"x" * 100, publish=True):
    staging = ckpt_dir / cl.tmp_dirname(step, "t")
    staging.mkdir(parents=True)
    (staging / "rank-00000.pt").write_bytes(payload)
    if publish:
        return lw.publish(staging, lw.build_manifest(staging, step=step, epoch=0, world_size=1, fmt="test"))
    return staging


def test_latest_is_highest_complete_step(tmp_path):
    make(tmp_path, 10)
    make(tmp_path, 20)
    make(tmp_path, 30, publish=False)  # a crashed save
    latest = cl.latest_complete(tmp_path)
    assert latest.step == 20 and latest.path.name == "step-000000020"


def test_truncated_file_makes_a_checkpoint_incomplete(tmp_path):
    make(tmp_path, 10)
    p = make(tmp_path, 20)
    (p / "rank-00000.pt").write_bytes(b"short")
    assert cl.latest_complete(tmp_path).step == 10
    assert not cl.verify_checksums(p) and cl.verify_checksums(tmp_path / "step-000000010")


def test_manifest_cannot_point_outside(tmp_path):
    p = make(tmp_path, 10)
    m = json.loads((p / cl.MANIFEST).read_text())
    m["files"][0]["path"] = "../../etc/passwd"
    (p / cl.MANIFEST).write_text(json.dumps(m))
    assert cl.latest_complete(tmp_path) is None


def test_retention_keeps_newest_and_never_the_latest(tmp_path):
    for s in (10, 20, 30, 40):
        make(tmp_path, s)
    lw.apply_retention(tmp_path, keep=2)
    assert [r.step for r in cl.complete_checkpoints(tmp_path)] == [30, 40]
    lw.apply_retention(tmp_path, keep=0)
    assert [r.step for r in cl.complete_checkpoints(tmp_path)] == [40]


def test_stale_staging_dirs_are_swept(tmp_path):
    make(tmp_path, 10, publish=False)
    assert lw.remove_stale_tmp(tmp_path) and not list(tmp_path.iterdir())


def test_seed_style_flat_files_newest_readable(tmp_path):
    for e, s in ((0, 100), (1, 50), (1, 200)):
        with zipfile.ZipFile(tmp_path / f"checkpoint_epoch{e}_step{s}.pt", "w") as z:
            z.writestr("data.pkl", b"x")
    (tmp_path / "checkpoint_epoch2_step10.pt").write_bytes(b"torn write, no zip directory")
    ref = cl.find_latest(tmp_path, "checkpoint_epoch*_step*.pt")
    assert ref.path.name == "checkpoint_epoch1_step200.pt" and ref.step == 200
