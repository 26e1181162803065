"""Who reports what when one job spans several hosts (docs/multinode.md): each node's local rank 0
writes the heartbeat file its own daemon watches, and sweeps its host's JIT boundary files; only
global rank 0 publishes checkpoints into the shared dir."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from trainer_runs import Run, kill9_everything

from harness import EXAMPLES
from spx.daemon.contract import checkpoint_layout as layout
from spx.daemon.contract.worker_env import ENV_ATTEMPT_ID, read_heartbeat
from spx.daemon.run.launcher import free_port
from spx.trainer.heartbeat import node_heartbeat_file
from spx.trainer.jit import BOUNDARY_PREFIX, JitCheckpoint


def test_local_rank_0_of_every_node_writes_its_daemons_heartbeat_file():
    assert node_heartbeat_file("/run/spx/hb.json", local_rank=0) == "/run/spx/hb.json"
    assert node_heartbeat_file("/run/spx/hb.json", local_rank=1) is None
    assert node_heartbeat_file(None, local_rank=0) is None


@pytest.mark.parametrize("rank, local_rank, swept", [(2, 0, True), (0, 0, True), (3, 1, False)])
def test_each_nodes_local_rank_0_sweeps_that_hosts_stale_boundary_files(tmp_path, rank, local_rank, swept):
    stale = tmp_path / (BOUNDARY_PREFIX + "oldtoken")
    stale.mkdir()
    (stale / "rank-00002.step-000000007.pt").write_bytes(b"x")
    jit = JitCheckpoint(enabled=True, boundary_parent=tmp_path, ckpt_dir=tmp_path / "ck", rank=rank, world_size=4,
                        token="live", fmt="spx", checksums=False, local_rank=local_rank)
    assert stale.exists() is not swept
    assert (tmp_path / (BOUNDARY_PREFIX + "live")).is_dir()
    jit.close()


def _start_node(work: Path, node: int, endpoint: str, ckpt: Path, steps: int) -> Run:
    """One host's share of a 2-node × 2-process job: its own torchrun agent and heartbeat file."""
    hb, log = work / f"node{node}.heartbeat", work / f"node{node}.log"
    env = {**os.environ, "SPX_CHECKPOINT_DIR": str(ckpt), "SPX_HEARTBEAT_FILE": str(hb), "SPX_ATTEMPT": "1",
           "OMP_NUM_THREADS": "1", ENV_ATTEMPT_ID: (tag := uuid.uuid4().hex)}
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=roles", "--max-restarts=0",
            str(EXAMPLES / "train_ddp.py"), "--batch_size", "4", "--model-size", "tiny", "--seed", "3",
            "--steps", str(steps), "--checkpoint-every", "4", "--dataset-size", "64"]
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return Run(proc, tag, ckpt, hb, log)


@pytest.mark.slow
def test_two_nodes_each_get_a_heartbeat_and_rank_0_alone_publishes(tmp_path):
    """Two torchrun agents on this host meeting at a loopback c10d endpoint: the trainer sees two
    nodes of two (LOCAL_RANK 0-1, ranks 0-3) exactly as on two hosts."""
    ckpt, steps = tmp_path / "shared-ckpt", 8
    endpoint = f"127.0.0.1:{free_port()}"
    runs = [_start_node(tmp_path, n, endpoint, ckpt, steps) for n in (0, 1)]
    try:
        for run in runs:
            assert run.wait(120) == 0, run.output()[-3000:]
    finally:
        for run in runs:
            if run.proc.poll() is None:
                kill9_everything(run)
    for run in runs:
        beat = read_heartbeat(run.heartbeat)
        assert beat is not None and beat.step == steps and beat.status == "finished", run.output()[-2000:]
    node0, node1 = (read_heartbeat(r.heartbeat) for r in runs)
    assert node0.last_checkpoint_step == steps, "global rank 0 knows what it published"
    assert node1.last_checkpoint_step is None, "the other node's local rank 0 publishes nothing"
    complete = [p for p in ckpt.iterdir() if layout.read_manifest(p) is not None]
    assert sorted(p.name for p in complete) == [layout.step_dirname(s) for s in (4, 8)]
    manifest = layout.read_manifest(ckpt / layout.step_dirname(steps))
    assert manifest["world_size"] == 4
    assert not [p for p in ckpt.iterdir() if p.name.startswith(".") or ".tmp" in p.name], "no staging left"
    assert runs[0].final_hash() and "final_state_sha256=" not in runs[1].output(), "rank 0 is on node 0 only"
