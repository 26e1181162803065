"""Where a host's node is in a job across hosts (docs/multinode.md): the heartbeat fields that say it,
how the daemon's views, `spx status` and the job metrics show it, and that one-host jobs and old
heartbeats are read as before."""

from __future__ import annotations

import json
import time

import pytest

from spx.daemon.cli.render import print_status
from spx.daemon.contract.worker_env import Heartbeat, parse_heartbeat, write_heartbeat
from spx.daemon.core.spec import parse_spec
from spx.daemon.exporter.job_collector import JobCollector
from spx.daemon.state.jobviews import heartbeat_path, job_view
from spx.daemon.state.node_view import NodeView
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store

WIDE = ("name: wide\nscript: train.py\ngpus: 2\ncheckpoints: {dir: /shared/ckpt/wide}\n"
        "nodes: {count: 2, rdzv_endpoint: '10.0.0.1:29400'}\n")


def test_a_beat_round_trips_its_node_and_an_old_beat_still_parses():
    beat = Heartbeat(step=5, node_rank=1, nnodes=2, ranks=[2, 3], time=10.0)
    parsed = parse_heartbeat(beat.to_json())
    assert parsed is not None and (parsed.node_rank, parsed.nnodes, parsed.ranks) == (1, 2, [2, 3])
    old = parse_heartbeat(json.dumps({"step": 7, "epoch": 0, "samples_per_second": 1.5, "status": "running",
                                      "time": 10.0, "last_checkpoint_step": None, "last_checkpoint_time": None}))
    assert old is not None and old.step == 7 and (old.node_rank, old.nnodes, old.ranks) == (None, None, None)


@pytest.mark.parametrize("fields", [
    {"node_rank": -1}, {"node_rank": 2, "nnodes": 2}, {"node_rank": True}, {"node_rank": "1"}, {"node_rank": 1.0},
    {"nnodes": 0}, {"nnodes": False}, {"nnodes": "2"},
    {"ranks": [3, 2]}, {"ranks": [1]}, {"ranks": [0, 1, 2]}, {"ranks": "0-1"}, {"ranks": [0, 1.5]},
    {"ranks": [-1, 0]}, {"ranks": [True, 1]}, {"ranks": {"0": 1}},
])
def test_a_beat_with_a_node_field_out_of_range_is_not_a_beat(fields):
    assert parse_heartbeat(json.dumps({"step": 1, "time": 10.0, **fields})) is None


def _running_job(tmp_path, text):
    store = Store(tmp_path / "s.sqlite")
    jid = store.jobs.add(parse_spec(text), 0, "root", "/x", 1.0)
    store.jobs.transition(jid, JobState.STARTING, "starting", 2.0)
    store.attempts.start(jid, number=1, attempt_id="u1", now=10.0, resumed_from=None, resumed_from_step=None, port=1,
                        generation=2)
    store.jobs.transition(jid, JobState.RUNNING, "fresh start", 10.0)
    run = tmp_path / "run"
    path = heartbeat_path(run, store.jobs.get(jid))
    path.parent.mkdir(parents=True)
    return store, jid, run, path


def test_a_node_of_a_job_across_hosts_is_in_its_view_status_and_metrics(tmp_path, capsys):
    store, jid, run, path = _running_job(tmp_path, WIDE)
    view = job_view(store, store.jobs.get(jid), run)
    # Before the first beat only the spec's part is known.
    assert view.node == NodeView(node_rank=None, nnodes=2, ranks=None, rdzv_endpoint="10.0.0.1:29400",
                                 rdzv_backend="c10d", rdzv_id="wide", generation=2)
    assert _node_rank_samples(view) == []

    write_heartbeat(path, Heartbeat(step=3, node_rank=1, nnodes=2, ranks=[2, 3], time=20.0))
    hosts = [{"host": "node0", "generation": 2, "state": "running", "time": time.time() - 3, "step": 3},
             {"host": "node1", "generation": 1, "state": "ended", "time": time.time() - 40, "step": 2}]
    view = job_view(store, store.jobs.get(jid), run, with_history=True, gang_hosts=hosts)
    doc = view.to_json(with_history=True)
    assert doc["node"] == {"node_rank": 1, "nnodes": 2, "ranks": [2, 3], "rdzv_endpoint": "10.0.0.1:29400",
                           "rdzv_backend": "c10d", "rdzv_id": "wide", "generation": 2, "hosts": hosts}
    json.dumps(doc)  # what the control socket sends
    print_status(doc)
    out = capsys.readouterr().out
    assert "  node 1 of 2, ranks 2–3, rendezvous 10.0.0.1:29400 (c10d, wide)\n" in out
    assert "  generation 2 (rendezvous round wide-g2)\n" in out
    assert "  host node0: running in generation 2, step 3, 3 s ago\n" in out, out
    assert "  host node1: ended in generation 1, step 2, 40 s ago\n" in out, out
    assert _node_rank_samples(view) == [({"spx_job": "wide"}, 1.0)]
    assert _node_rank_samples(view, "spx_job_generation") == [({"spx_job": "wide"}, 2.0)]
    store.close()


def test_a_beat_of_the_previous_attempt_does_not_say_where_this_one_is(tmp_path):
    """torch numbers the nodes again at each rendezvous: the last attempt's node rank may not hold."""
    store, jid, run, path = _running_job(tmp_path, WIDE)
    write_heartbeat(path, Heartbeat(step=3, node_rank=0, nnodes=2, ranks=[0, 1], time=20.0))
    assert job_view(store, store.jobs.get(jid), run).node.node_rank == 0
    attempt = store.attempts.open_for(jid)
    assert attempt is not None
    store.attempts.end(attempt.id, end=30.0, exit_code=1, reason="exit code 1", reason_class="communication")
    store.attempts.start(jid, number=2, attempt_id="u2", now=40.0, resumed_from=None, resumed_from_step=None, port=2)
    node = job_view(store, store.jobs.get(jid), run).node
    assert node is not None and (node.node_rank, node.ranks, node.nnodes) == (None, None, 2)
    store.close()


def test_a_one_host_job_shows_no_node_even_with_torchs_numbers_in_its_beat(tmp_path, capsys):
    store, jid, run, path = _running_job(tmp_path, "name: one\nscript: train.py\ngpus: 2\n")
    write_heartbeat(path, Heartbeat(step=3, node_rank=0, nnodes=1, ranks=[0, 1], time=20.0))
    view = job_view(store, store.jobs.get(jid), run)
    assert view.node is None and view.to_json()["node"] is None
    print_status(view.to_json())
    assert "rendezvous" not in capsys.readouterr().out
    assert _node_rank_samples(view) == []
    store.close()


def _node_rank_samples(view, name: str = "spx_job_node_rank") -> list[tuple[dict, float]]:
    metrics, ok = JobCollector(lambda: [view]).collect()
    assert ok
    family = next(m for m in metrics if m.name == name)
    return [(s.labels, s.value) for s in family.samples]
