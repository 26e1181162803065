"""The worker's side of fencing (spx.trainer.layout_writer, contract/fencing.py), in real worker
processes: with its lease still at its SPX_FENCE, a checkpoint is published; once another host took
the lease, the worker publishes nothing (no checkpoint, no retention, its staging dir gone), says why
and exits 77 (EXIT_FENCED)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from lease_fixtures import leased_dir

from spx.daemon.contract import checkpoint_layout
from spx.daemon.contract.worker_env import ENV_CHECKPOINT_DIR, ENV_FENCE, EXIT_FENCED

WORKER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from spx.trainer import layout_writer
    ckpt, step = Path(sys.argv[1]), int(sys.argv[2])
    staging = ckpt / f"step-{step:09d}.tmp-worker"
    staging.mkdir()
    (staging / "model.pt").write_bytes(b"weights")
    manifest = layout_writer.build_manifest(staging, step=step, epoch=0, world_size=1, fmt="spx-ddp")
    print("published", layout_writer.publish(staging, manifest))
    print("retired", [p.name for p in layout_writer.apply_retention(ckpt, 1)])
""")


def worker(ckpt: Path, step: int, fence: int) -> subprocess.CompletedProcess:
    env = {**os.environ, ENV_CHECKPOINT_DIR: str(ckpt), ENV_FENCE: str(fence)}
    return subprocess.run([sys.executable, "-c", WORKER, str(ckpt), str(step)], env=env, capture_output=True,
                          text=True, timeout=60)


def test_a_worker_publishes_under_its_own_lease_and_nothing_once_another_host_took_it(tmp_path):
    ckpt = leased_dir(tmp_path, 3)
    ok = worker(ckpt, 10, fence=3)
    assert ok.returncode == 0, ok.stderr
    assert checkpoint_layout.latest_complete(ckpt).step == 10
    # Another host took the lease over (generation 4): this host's worker still runs, with fence 3.
    (ckpt / ".spx" / "lease").write_text(json.dumps({"host": "b", "job": "j", "expires": 1e12, "gen": 4}))
    fenced = worker(ckpt, 20, fence=3)
    assert fenced.returncode == EXIT_FENCED, (fenced.returncode, fenced.stderr)
    assert "launched with lease generation 3" in fenced.stderr and "generation 4" in fenced.stderr
    assert [r.step for r in checkpoint_layout.complete_checkpoints(ckpt)] == [10], "nothing published, nothing retired"
    assert sorted(p.name for p in ckpt.iterdir()) == [".spx", "step-000000010"], "its staging dir is gone too"
