"""The generation protocol in a job's shared `.spx-gang/` (userfs/gang_dir.py), on a real directory:
one host begins each generation, a join waits for hosts still in an older one, and what the user
may have put there (garbage, a link, a FIFO) is never followed or blocked on."""

from __future__ import annotations

import json
import os

import pytest

from spx.daemon.run import gang
from spx.daemon.userfs import gang_dir


def host(i: int, now: float = 1000.0) -> dict:
    return {"host": f"machine:{i}", "key": f"{i:016x}", "label": f"node{i}", "now": now}


def bump(reason: str = "exit code 1", final: str | None = None) -> dict:
    return {"reason": reason, "counted": True, "not_before": 1005.0, "final": final}


def test_only_one_host_begins_the_next_generation(tmp_path):
    first = gang_dir.advance({**host(0), "dir": str(tmp_path), "from_gen": 0, "bump": bump(), "step": 7})
    second = gang_dir.advance({**host(1), "dir": str(tmp_path), "from_gen": 0, "bump": bump("killed by SIGKILL")})
    assert first["won"] and not second["won"]
    assert second["current"]["gen"] == 1 and second["current"]["label"] == "node0"
    turn = gang.turn_of(second["current"], 1000.0)
    assert turn is not None and (turn.gen, turn.by, turn.reason, turn.counted, turn.delay) == (1, "node0", "exit code 1",
                                                                                             True, 5.0)
    lines = {d["label"]: d for d in gang_dir.beat({**host(2), "dir": str(tmp_path), "gen": 1})["hosts"]}
    assert (lines["node0"]["gen"], lines["node0"]["state"]) == (0, "ended")
    assert (lines["node2"]["gen"], lines["node2"]["state"]) == (1, "running")


def test_join_takes_the_newer_generation_or_begins_one_after_its_own(tmp_path):
    d = str(tmp_path)
    assert gang_dir.join({**host(0), "dir": d, "last": None, "stale_seconds": 15})["gen"] == 0, "a first attempt"
    gang_dir.advance({**host(1), "dir": d, "from_gen": 0, "bump": bump()})
    assert gang_dir.join({**host(0), "dir": d, "last": 0, "stale_seconds": 15})["gen"] == 1, "follows the newer one"
    # Its last attempt ran in 1 and nobody moved on (its daemon was down): a new round for all.
    joined = gang_dir.join({**host(0), "dir": d, "last": 1, "stale_seconds": 15})
    assert joined["gen"] == 2 and joined["current"]["reason"] == "a host rejoined"


def test_a_final_generation_ends_a_rejoining_host_but_not_a_new_job(tmp_path):
    gang_dir.advance({**host(1), "dir": str(tmp_path), "from_gen": 0, "bump": bump("cancelled by bob", "cancelled")})
    ended = gang_dir.join({**host(0), "dir": str(tmp_path), "last": 0, "stale_seconds": 15})
    assert ended["current"]["final"] == "cancelled"
    fresh = gang_dir.join({**host(0), "dir": str(tmp_path), "last": None, "stale_seconds": 15})
    assert fresh["gen"] == 2 and not fresh["current"]["final"], "a new job where the last one ended starts a round"


def test_join_waits_while_another_host_still_runs_an_older_generation(tmp_path):
    gang_dir.beat({**host(1, now=1000.0), "dir": str(tmp_path), "gen": 0})
    gang_dir.advance({**host(0), "dir": str(tmp_path), "from_gen": 0, "bump": bump()})
    waiting = gang_dir.join({**host(0, now=1002.0), "dir": str(tmp_path), "last": 0, "stale_seconds": 15})
    assert waiting["wait"] == "node1" and waiting["gen"] == 1, "node1's agent may still serve round 0's store"
    stale = gang_dir.join({**host(0, now=1020.0), "dir": str(tmp_path), "last": 0, "stale_seconds": 15})
    assert stale["gen"] == 1 and "wait" not in stale, "a line not rewritten for 15 s is a daemon that is gone"
    gang_dir.advance({**host(1, now=1021.0), "dir": str(tmp_path), "from_gen": 0, "bump": None})
    assert "wait" not in gang_dir.join({**host(0, now=1022.0), "dir": str(tmp_path), "last": 0, "stale_seconds": 15})


def test_garbage_is_generation_0_and_links_and_fifos_are_refused(tmp_path):
    (tmp_path / ".spx-gang").mkdir()
    (tmp_path / ".spx-gang" / "generation").write_text("not json")
    assert gang_dir.join({**host(0), "dir": str(tmp_path), "last": None, "stale_seconds": 15})["gen"] == 0
    assert gang.turn_of({"gen": True}, 0.0) is None and gang.turn_of({"gen": -1}, 0.0) is None
    assert gang.turn_of({"gen": 2, "final": "succeeded"}, 0.0).final is None, "only failed / cancelled end a job"
    os.unlink(tmp_path / ".spx-gang" / "generation")
    os.mkfifo(tmp_path / ".spx-gang" / "generation")
    with pytest.raises(OSError, match="not a regular file"):
        gang_dir.advance({**host(0), "dir": str(tmp_path), "from_gen": 0, "bump": bump()})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    os.symlink(elsewhere, other / ".spx-gang")
    with pytest.raises(OSError, match="symbolic link"):
        gang_dir.beat({**host(0), "dir": str(other), "gen": 0})
    assert os.listdir(elsewhere) == []
    (tmp_path / "hosts-test").mkdir()
    lines = gang_dir.beat({**host(0), "dir": str(tmp_path / "hosts-test"), "gen": 0})["hosts"]
    assert json.loads(json.dumps(lines))[0]["label"] == "node0"


def test_a_new_job_where_an_earlier_one_succeeded_begins_a_round_of_its_own(tmp_path):
    d = str(tmp_path)
    for i in (0, 1):  # an earlier job ran in generation 0 on two hosts and succeeded (no bump)
        gang_dir.join({**host(i, now=100.0), "dir": d, "last": None, "stale_seconds": 15})
        gang_dir.advance({**host(i, now=200.0), "dir": d, "from_gen": 0, "bump": None})
    first = gang_dir.join({**host(0, now=1000.0), "dir": d, "last": None, "stale_seconds": 15})
    assert first["gen"] == 1, "round wide-g0 may still be closed in an etcd: not reused"
    gang_dir.beat({**host(0, now=1025.0), "dir": d, "gen": 1})  # its share waits at the rendezvous
    second = gang_dir.join({**host(1, now=1030.0), "dir": d, "last": None, "stale_seconds": 15})
    assert second["gen"] == 1, "host 0 runs in generation 1: this job's, joined"


def test_a_host_is_missing_once_silent_past_the_timeout_and_the_attempt_waited_as_long():
    lines = [{"host": "node0", "time": 1000.0}, {"host": "node1", "time": 300.0}]
    assert gang.missing(lines, "node0", 2, 600, 1000.0, since=500.0) is None, "the attempt has not waited 600 s"
    assert gang.missing(lines, "node0", 2, 600, 1000.0, since=100.0) == (
        "host node1 gone: no word from its daemon for 700 s (nodes.host_timeout_seconds: 600)")
    assert gang.missing([{"host": "node0", "time": 999.0}], "node0", 3, 600, 1000.0, since=300.0) == (
        "only 1 of 3 hosts came in 700 s (nodes.host_timeout_seconds: 600)")
    assert gang.missing(lines[:1] + [{"host": "node1", "time": 990.0}], "node0", 2, 600, 1000.0, 0.0) is None
