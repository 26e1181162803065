"""Replay verification on the daemon's side: the verdict a replay's heartbeat carries is bounded
(contract/replay_verdict.py); a replay job's verdict is stored on the job it verified, the GPU of the
rank whose gradient differed is struck, a GPU is quarantined only on strikes from two owners, and the
verified job hears of a difference (run/verification.py); an operator's release clears the strikes
(gpu/gate.py); `spx verify`'s job file is the job's own command as a replay (intake/replay_file.py);
the checkpoints from the differing step on are set aside, as the owner (userfs/user_actions.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from spx.daemon.contract.replay_verdict import ReplayVerdict, parse_replay_verdict
from spx.daemon.contract.worker_env import Heartbeat, load_heartbeat
from spx.daemon.core.spec import SpecError, parse_spec
from spx.daemon.intake.replay_file import replay_file
from spx.daemon.lifecycle.actions import RecordVerdict
from spx.daemon.lifecycle.observations import ReplayDiffered
from spx.daemon.run.verification import Verifications
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store
from spx.daemon.userfs import user_actions

DIFFERS = ReplayVerdict(0, 40, False, ((0, 10), (10, 20)), 25, "rank_grad_norm", 1, "0.8311", "0.8312")
CLEAN = ReplayVerdict(0, 40, True, ((0, 10), (10, 20), (20, 30), (30, 40)))


def test_a_verdict_survives_the_heartbeat_and_says_itself_in_one_line():
    got = load_heartbeat(Heartbeat(step=40, status="replayed", replay=DIFFERS).to_json()).replay
    assert got == DIFFERS
    assert got.describe() == ("differs at step 25: rank 1's gradient norm 0.8312, recorded 0.8311; "
                              "checkpoints 10–20 verified before it")
    assert CLEAN.describe() == "checkpoints 10–40 verified (replayed steps 0–40)"
    assert ReplayVerdict(None, None, None, reason="no checkpoint has a replay record").describe() == (
        "not verified: no checkpoint has a replay record")


@pytest.mark.parametrize("odd", [
    {"verified": "yes"}, {"verified": False, "metric": "vibes"}, {"verified": True, "intervals": [[0]]},
    {"verified": True, "intervals": [[0, 10]] * 1001}, {"verified": False, "step": -1},
    {"verified": None, "reason": "x" * 401}, [1, 2], "replayed",
])
def test_an_odd_verdict_costs_only_itself_never_the_beat(odd):
    doc = json.loads(Heartbeat(step=40).to_json()) | {"replay": odd}
    beat = load_heartbeat(json.dumps(doc))
    assert beat.step == 40 and beat.replay is None and parse_replay_verdict(odd) is None


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state.sqlite")
    yield s
    s.close()


def add(store, text, uid=1000, owner="alice", gpus=()):
    spec = parse_spec(text).with_checkpoint_dir(Path("/ck"), owner, uid)
    job_id = store.jobs.add(spec, uid, owner, "/x", 1.0)
    if gpus:
        store.jobs.transition(job_id, JobState.STARTING, "GPUs allocated", 2.0, gpus=list(gpus))
    return store.jobs.get(job_id)


def replay_of(store, name, uid=1000, owner="alice", ckpt=None, gpus=(4, 5)):
    ckpt = ckpt or f"/ck/{owner}/{name}"
    return add(store, f"name: {name}.verify\nscript: t.py\ngpus: 2\ncheckpoints: {{dir: {ckpt}}}\n"
                      f"replay: {{of: {name}}}\n", uid, owner, gpus)


def record(store, job, verdict, quarantined):
    v = Verifications(store, lambda gpu, reason: quarantined.append((gpu, reason)), wall=lambda: 100.0)
    s = SimpleNamespace(ledger=SimpleNamespace(gpus=tuple(job.gpus)))
    v.record(job, s, RecordVerdict(1, job.spec.replay.of, verdict, "exit code 0"))
    return v.results()


def test_a_differing_replay_is_stored_strikes_the_ranks_gpu_and_rolls_the_job_back(store):
    train = add(store, "name: train\nscript: t.py\ngpus: 2\n", gpus=(0, 1))
    quarantined: list = []
    told = record(store, replay_of(store, "train"), DIFFERS, quarantined)
    assert told == [(train.id, ReplayDiffered(25, "rank 1's gradient norm 0.8312, recorded 0.8311"))]
    [row] = store.verifications.for_job(train.id)
    assert row.verified is False and row.doc["suspect"] == 1 and row.doc["trained_on"] == [0, 1]
    assert row.doc["replay_gpus"] == [4, 5] and row.doc["text"].endswith("; GPU 1 suspect")
    assert [(s.gpu, s.owner_uid, s.step) for s in store.verifications.strikes()[1]] == [(1, 1000, 25)]
    assert quarantined == []  # one owner's strikes never take a GPU from everyone


def test_strikes_from_two_owners_quarantine_the_gpu(store):
    quarantined: list = []
    for uid, owner, name in ((1000, "alice", "train"), (1001, "bob", "tune")):
        add(store, f"name: {name}\nscript: t.py\ngpus: 2\n", uid, owner, gpus=(0, 1))
        record(store, replay_of(store, name, uid, owner), DIFFERS, quarantined)
    assert [g for g, _ in quarantined] == [1] and "2 owners" in quarantined[0][1]


def test_a_clean_replay_is_stored_and_changes_nothing(store):
    train = add(store, "name: train\nscript: t.py\ngpus: 2\n", gpus=(0, 1))
    assert record(store, replay_of(store, "train"), CLEAN, []) == []
    [row] = store.verifications.for_job(train.id)
    assert row.verified is True and store.verifications.strikes() == {}


def test_a_replay_of_another_dir_or_without_a_verdict_rolls_nothing_back(store):
    train = add(store, "name: train\nscript: t.py\ngpus: 2\n", gpus=(0, 1))
    elsewhere = replay_of(store, "train", ckpt="/elsewhere")
    assert record(store, elsewhere, DIFFERS, []) == []
    assert store.verifications.for_job(train.id) == []
    store.jobs.transition(elsewhere.id, JobState.SUCCEEDED, "exit code 0", 3.0)
    assert record(store, replay_of(store, "train"), None, []) == []
    [row] = store.verifications.for_job(train.id)
    assert row.verified is None and row.doc["text"].startswith("not verified: the replay ended without a verdict")


def test_spx_verify_writes_the_jobs_own_command_as_a_one_shot_replay(store):
    train = add(store, "name: train\nscript: /w/t.py\nargs: [--lr, '3e-4']\ngpus: 2\nenv: {A: b}\n"
                       "restart: {max_restarts: 9}\nnotify: {webhook: 'https://x.example/h'}\n", gpus=(0, 1))
    answer = replay_file(store, train, 1000, json.dumps({"from_step": 20, "gpus": [4, 5]}))
    spec = parse_spec(answer["result"])
    assert (spec.name, spec.script, spec.args, spec.env, spec.gpus) == ("train.verify", "/w/t.py", ["--lr", "3e-4"],
                                                                      {"A": "b"}, [4, 5])
    assert spec.replay.of == "train" and spec.replay.from_step == 20 and spec.restart.max_restarts == 0
    assert spec.checkpoints.dir == Path("/ck/alice/train") and spec.notify is None
    assert replay_file(store, train, 1001, None)["error"] == "a replay runs as the job's owner: run spx verify as alice"
    assert "needs as many" in replay_file(store, train, 1000, json.dumps({"gpus": [4]}))["error"]


def test_a_replay_file_must_name_the_dir_it_reads():
    with pytest.raises(SpecError, match="give that job's dir as `checkpoints.dir`"):
        parse_spec("name: t.verify\nscript: t.py\nreplay: {of: t}\n")
    with pytest.raises(SpecError, match="other than never"):
        parse_spec("name: t.verify\nscript: t.py\nreplay: {of: t}\ncheckpoints: {dir: /ck/t, resume: never}\n")
    assert yaml.safe_load("replay: {of: t}")  # the field's spelling


def test_the_checkpoints_from_the_differing_step_on_are_set_aside_not_deleted(tmp_path):
    for step in (10, 20, 30, 40):
        (tmp_path / f"step-{step:09d}").mkdir()
    (tmp_path / "step-000000030.tmp-abc").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    moved = user_actions._set_aside({"dir": str(tmp_path), "before": 0.0, "into": ".replay-differs-at-25",
                                     "from_step": 25})
    assert sorted(moved) == ["step-000000030", "step-000000040"]
    assert sorted(os.listdir(tmp_path / ".replay-differs-at-25")) == ["step-000000030", "step-000000040"]
    assert (tmp_path / "step-000000020").is_dir() and (tmp_path / "notes.txt").exists()


def test_a_job_asking_for_periodic_replays_gets_one_every_n_checkpoints_on_idle_gpus_only(tmp_path):
    from spx.daemon.contract.worker_env import write_heartbeat
    from spx.daemon.core.config import DaemonConfig
    from spx.daemon.run.auto_verify import CHECK_EVERY_SECONDS, AutoVerify
    from spx.daemon.state.jobviews import heartbeat_path

    cfg = DaemonConfig.rooted(tmp_path / "root")
    (cfg.state_dir / "jobs").mkdir(parents=True)
    store = Store(cfg.store_path)
    clock = [0.0]
    auto = AutoVerify(cfg, store, clock=lambda: clock[0])
    train = add(store, "name: train\nscript: t.py\ngpus: 2\nverify: {every_checkpoints: 2}\n", gpus=(0, 1))
    store.jobs.transition(train.id, JobState.RUNNING, "running", 3.0)
    beat_file = heartbeat_path(cfg.run_dir, train)
    beat_file.parent.mkdir(parents=True)
    idle = [[2, 3, 4]]

    def look(checkpoint: int | None, queued_too: bool = False) -> list[str]:
        if checkpoint is not None:
            write_heartbeat(beat_file, Heartbeat(step=checkpoint + 1, last_checkpoint_step=checkpoint))
        clock[0] += CHECK_EVERY_SECONDS
        auto.tick(store.jobs.live, lambda live: idle[0])
        return [j.name for j in store.jobs.live() if j.spec.replay is not None]

    assert look(10) == []                                   # one checkpoint seen
    idle[0] = [2]
    assert look(20) == []                                   # two, but one idle GPU for a 2-GPU job
    idle[0] = [2, 3, 4]
    assert look(None) == ["train.verify"]                   # GPUs idle now: queued, pinned to them
    replay = store.jobs.by_name("train.verify")
    assert (replay.spec.gpus, replay.spec.replay.from_step, replay.priority) == ([2, 3], None, -1000)
    assert replay.owner_uid == train.owner_uid and replay.spec.checkpoints.dir == train.spec.checkpoints.dir
    assert look(30) == ["train.verify"] and look(40) == ["train.verify"]  # one at a time
    store.jobs.transition(replay.id, JobState.CANCELLED, "cancelled by root", 4.0)
    assert look(None) == ["train.verify"]                   # the next covers the intervals since checkpoint 20
    assert store.jobs.by_name("train.verify").spec.replay.from_step == 20
    store.close()
