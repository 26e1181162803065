"""Each node's heartbeat says where the node is in torch's numbering (node rank of how many, its
global ranks), from the environment torch's elastic agent gives every worker; without that
environment (run by hand) the beat leaves them out, as before."""

from __future__ import annotations

import pytest

from spx.daemon.contract.worker_env import read_heartbeat
from spx.trainer.heartbeat import HeartbeatWriter, NodePlacement, node_placement


def torch_env(group: int, groups: int, local: int, local_size: int) -> dict[str, str]:
    """What torch.distributed.run sets for a worker (local_elastic_agent), homogeneous nodes."""
    return {"GROUP_RANK": str(group), "GROUP_WORLD_SIZE": str(groups), "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(local_size), "RANK": str(group * local_size + local),
            "WORLD_SIZE": str(groups * local_size)}


def test_the_second_of_two_nodes_of_two_workers_holds_ranks_2_to_3():
    assert node_placement(torch_env(1, 2, 0, 2)) == NodePlacement(node_rank=1, nnodes=2, first=2, last=3)
    assert node_placement(torch_env(1, 2, 1, 2)) == NodePlacement(node_rank=1, nnodes=2, first=2, last=3)
    assert node_placement(torch_env(0, 1, 0, 8)) == NodePlacement(node_rank=0, nnodes=1, first=0, last=7)


@pytest.mark.parametrize("env", [
    {}, {k: v for k, v in torch_env(1, 2, 0, 2).items() if k != "GROUP_WORLD_SIZE"},
    {**torch_env(1, 2, 0, 2), "GROUP_RANK": "x"}, {**torch_env(1, 2, 0, 2), "GROUP_RANK": "2"},
    {**torch_env(0, 2, 1, 2), "RANK": "0"}, {**torch_env(0, 2, 0, 2), "LOCAL_RANK": "2"},
])
def test_no_placement_without_torchs_consistent_numbers(env):
    assert node_placement(env) is None


def test_the_writer_puts_its_nodes_placement_in_every_beat(tmp_path, monkeypatch):
    for key, value in torch_env(1, 2, 0, 2).items():
        monkeypatch.setenv(key, value)
    writer = HeartbeatWriter(tmp_path / "hb.json")
    writer.tick(step=4, epoch=0, samples=8, last_checkpoint=None, force=True)
    beat = read_heartbeat(tmp_path / "hb.json")
    assert beat is not None and (beat.step, beat.node_rank, beat.nnodes, beat.ranks) == (4, 1, 2, [2, 3])


def test_run_by_hand_the_beat_has_no_placement(tmp_path, monkeypatch):
    for key in ("GROUP_RANK", "GROUP_WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK"):
        monkeypatch.delenv(key, raising=False)
    writer = HeartbeatWriter(tmp_path / "hb.json")
    writer.tick(step=1, epoch=0, samples=8, last_checkpoint=None, force=True)
    beat = read_heartbeat(tmp_path / "hb.json")
    assert beat is not None and (beat.node_rank, beat.nnodes, beat.ranks) == (None, None, None)
