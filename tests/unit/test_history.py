"""`spx history` without a daemon: what each job used (state/accounting.py) from a real store on disk,
its table, the attempt cgroup's memory.peak (read and stored, the memory controller enabled), the
store's migration to the column, `spx schema`, and what `spx submit --check` says a job would do."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
import yaml

from spx.daemon.cli import history, job_schema, submit_check
from spx.daemon.cli.colour import Paint
from spx.daemon.cli.parser import build_parser
from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.spec import parse_spec
from spx.daemon.run import cgroups
from spx.daemon.state import accounting, schema
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store
from spx.daemon.userfs import as_user

GIB = 1 << 30


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "spx.sqlite")
    yield s
    s.close()


def attempt(store: Store, job_id: int, number: int, start: float, end: float | None, peak: int | None,
            reason_class: str | None = None) -> None:
    row = store.attempts.start(job_id, number=number, attempt_id=f"a{number}", now=start, resumed_from=None,
                               resumed_from_step=None, port=None)
    if end is not None:
        store.attempts.end(row, end=end, memory_peak=peak, reason_class=reason_class)


def test_a_restarted_job_counts_its_attempts_time_on_gpus_and_its_largest_peak(store):
    jid = store.jobs.add(parse_spec("name: llama\nscript: t.py\ngpus: 4\n"), 1001, "alice", "/x", 100.0)
    attempt(store, jid, 1, start=1000.0, end=1000.0 + 3600, peak=2 * GIB, reason_class="crash")
    attempt(store, jid, 2, start=1000.0 + 3600 + 600, end=1000.0 + 3600 + 600 + 1800, peak=3 * GIB)
    for state in (JobState.STARTING, JobState.RUNNING):
        store.jobs.transition(jid, state, state.value, 1000.0)
    store.jobs.transition(jid, JobState.SUCCEEDED, "exit 0", 1000.0 + 6000)
    (used,) = accounting.usage_since(store, 0.0, now=99_999.0)
    assert (used.start, used.end, used.elapsed_seconds) == (1000.0, 1000.0 + 6000, 6000.0)  # backoff included
    assert used.gpu_hours == pytest.approx(4 * 1.5)  # 1 h + 0.5 h on 4 GPUs; the 10 min backoff holds none
    assert (used.attempts, used.gpus, used.memory_peak_bytes, used.state) == (2, 4, 3 * GIB, "succeeded")
    assert [a.reason_class for a in used.history] == ["crash", None]


def test_a_running_job_counts_up_to_now_and_an_unmeasured_peak_stays_unknown(store):
    jid = store.jobs.add(parse_spec("name: live\nscript: t.py\ngpus: 2\n"), 1001, "alice", "/x", 100.0)
    store.jobs.transition(jid, JobState.STARTING, "s", 200.0)
    store.jobs.transition(jid, JobState.RUNNING, "r", 201.0)
    attempt(store, jid, 1, start=200.0, end=None, peak=None)
    (used,) = accounting.usage_since(store, 0.0, now=200.0 + 1800)
    assert (used.end, used.elapsed_seconds, used.gpu_hours, used.memory_peak_bytes) == (None, 1800.0, 1.0, None)
    assert used.history[0].end is None


def test_a_job_over_with_its_attempt_left_open_counts_no_time_for_it(store):
    """A daemon error ended the job before its attempt's end was written: no known end, not 'until today'."""
    jid = store.jobs.add(parse_spec("name: lost\nscript: t.py\ngpus: 1\n"), 1001, "alice", "/x", 100.0)
    attempt(store, jid, 1, start=200.0, end=None, peak=None)
    store.jobs.transition(jid, JobState.FAILED, "daemon error", 300.0)
    (used,) = accounting.usage_since(store, 0.0, now=10**9)
    assert (used.gpu_hours, used.end, used.elapsed_seconds) == (0.0, None, 0.0)


def test_since_keeps_live_jobs_and_jobs_changed_since_and_a_never_started_job_counts_nothing(store):
    old = store.jobs.add(parse_spec("name: old\nscript: t.py\n"), 1, "a", "/x", 10.0)
    store.jobs.transition(old, JobState.CANCELLED, "c", 20.0)
    queued = store.jobs.add(parse_spec("name: waiting\nscript: t.py\n"), 1, "a", "/x", 30.0)
    assert [u.name for u in accounting.usage_since(store, 25.0, now=40.0)] == ["waiting"]
    (u,) = [u for u in accounting.usage_since(store, 0.0, now=40.0) if u.job_id == queued]
    assert (u.start, u.end, u.elapsed_seconds, u.gpu_hours, u.attempts) == (None, None, 0.0, 0.0, 0)


def test_attempts_of_many_jobs_are_read_in_chunks_within_sqlites_variable_limit(store):
    ids = [store.jobs.add(parse_spec(f"name: j{i}\nscript: t.py\n"), 1, "a", "/x", 1.0) for i in range(1200)]
    attempt(store, ids[-1], 1, start=5.0, end=6.0, peak=1)
    found = store.attempts.for_jobs(ids)
    assert len(found) == 1200 and [a.number for a in found[ids[-1]]] == [1] and found[ids[0]] == []


# --- the table --------------------------------------------------------------------------------------


def record(**over) -> dict:
    base = {"job_id": 12, "name": "llama", "owner": "alice", "owner_uid": 1001, "state": "succeeded",
            "submitted": 0.0, "start": 0.0, "end": 93_600.0 + 11, "elapsed_seconds": 93_611.0, "attempts": 2,
            "gpus": 8, "gpu_hours": 90.125, "memory_peak_bytes": int(61.2 * GIB),
            "history": [{"number": 1, "start": 0.0, "end": 10.0, "elapsed_seconds": 10.0, "gpu_hours": 0.02,
                         "memory_peak_bytes": None, "reason": "exit 1", "reason_class": "crash"},
                        {"number": 2, "start": 20.0, "end": None, "elapsed_seconds": 5.0, "gpu_hours": 0.01,
                         "memory_peak_bytes": 512, "reason": None, "reason_class": None}]}
    return {**base, **over}


def test_history_table_reads_as_sacct(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    lines = history.render([record()])
    assert lines[0].split() == ["JOB", "NAME", "STATE", "USER", "START", "END", "ELAPSED", "ATTEMPTS", "GPUS",
                                "GPU-HOURS", "PEAK", "MEM"]
    assert lines[1].split()[:4] == ["12", "llama", "succeeded", "alice"]
    assert lines[1].split()[-5:] == ["1-02:00:11", "2", "8", "90.12", "61.2G"]
    per_attempt = history.render([record()], per_attempt=True)
    assert [line.split()[0:3] for line in per_attempt[2:]] == [["attempt", "1", "crash"], ["attempt", "2", "running"]]
    assert per_attempt[2].split()[-1] == "-" and per_attempt[3].split()[-1] == "512B"
    assert history.render([record()], paint=Paint(True))[1] != lines[1]


@pytest.mark.parametrize(("seconds", "text"), [(0, "00:00:00"), (59.9, "00:00:59"), (3661, "01:01:01"),
                                                (86400 * 3 + 5, "3-00:00:05")])
def test_elapsed_as_sacct_writes_it(seconds, text):
    assert history.duration(seconds) == text


@pytest.mark.parametrize(("n", "text"), [(None, "-"), (0, "0B"), (1023, "1023B"), (1536, "1.5K"), (GIB, "1.0G"),
                                         (5 << 40, "5.0T")])
def test_memory_in_binary_units(n, text):
    assert history.memory(n) == text


def test_history_asks_the_daemon_since_the_parsed_time_and_filters_its_answer(monkeypatch, capsys):
    asked = []

    def ask(_cfg, op, name=None, arg=None):
        asked.append((op, arg))
        return [record(), record(job_id=13, owner="bob", owner_uid=1002, state="failed")]

    monkeypatch.setattr(history, "ask", ask)
    args = build_parser().parse_args(["history", "--since", "all", "--state", "failed", "--json"])
    assert history.cmd_history(None, args) == 0
    assert [r["job_id"] for r in json.loads(capsys.readouterr().out)] == [13]
    assert asked == [("accounting", "0.0")]


# --- memory.peak ------------------------------------------------------------------------------------


def test_memory_peak_is_the_cgroups_number_or_none(tmp_path):
    (tmp_path / "memory.peak").write_text("123456789\n")
    assert cgroups.memory_peak(tmp_path) == 123456789
    assert cgroups.memory_peak(tmp_path / "gone") is None
    (tmp_path / "memory.peak").write_text("max\n")
    assert cgroups.memory_peak(tmp_path) is None


def cgroup_dir(path: Path, controllers: str, subtree: str = "") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.controllers").write_text(controllers + "\n")
    (path / "cgroup.subtree_control").write_text(subtree)
    return path


def test_the_memory_controller_is_enabled_down_to_the_attempts(tmp_path):
    tree = cgroups.CgroupTree(cgroup_dir(tmp_path / "spx", "cpu memory pids"))
    cgroup_dir(tree.attempts, "cpu memory pids")
    assert tree.enable_memory_accounting() is None
    assert (tree.root / "cgroup.subtree_control").read_text() == "+memory"
    assert (tree.attempts / "cgroup.subtree_control").read_text() == "+memory"


def test_without_a_memory_controller_the_reason_is_given_and_nothing_written(tmp_path):
    tree = cgroups.CgroupTree(cgroup_dir(tmp_path / "spx", "cpu pids"))
    cgroup_dir(tree.attempts, "cpu pids")
    assert tree.enable_memory_accounting() == f"no memory controller in {tree.root}/cgroup.controllers"
    assert (tree.root / "cgroup.subtree_control").read_text() == ""


def test_a_version_1_store_gains_memory_peak(tmp_path):
    path = tmp_path / "s.sqlite"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE attempts DROP COLUMN memory_peak")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    store = Store(path)
    try:
        jid = store.jobs.add(parse_spec("name: a\nscript: t.py\n"), 1, "a", "/x", 1.0)
        attempt(store, jid, 1, start=1.0, end=2.0, peak=77)
        assert store.attempts.for_job(jid)[0].memory_peak == 77
        assert store.db.conn.execute("PRAGMA user_version").fetchone()[0] == schema.VERSION
    finally:
        store.close()


# --- spx schema ---------------------------------------------------------------------------------------


def test_the_schema_is_draft_2020_12_with_the_yaml_keys(tmp_path, capsys):
    doc = job_schema.job_schema()
    assert doc["$schema"] == job_schema.DIALECT and doc["type"] == "object"
    assert "name" in doc["required"] and {"launcher", "gpus", "checkpoints", "restart"} <= set(doc["properties"])
    stage = json.dumps(doc["$defs"])
    assert '"from"' in stage  # data.stage.from, as written in a job file, not the model's field name
    target = tmp_path / "job.schema.json"
    assert job_schema.cmd_schema(build_parser().parse_args(["schema", "-o", str(target)])) == 0
    assert json.loads(target.read_text()) == doc and not list(tmp_path.glob(".*.tmp"))
    assert "wrote" in capsys.readouterr().err


# --- spx submit --check: what it would do ---------------------------------------------------------------


def test_check_plans_attempt_1_as_the_daemon_would(tmp_path):
    cfg = DaemonConfig.rooted(tmp_path / "root")
    me = as_user.owner(os.getuid())
    spec = parse_spec(f"name: train\nlauncher: torchrun\nscript: train.py\nworkdir: {tmp_path}\ngpus: 2\n"
                      "args: [--lr, '0.1']\n").with_checkpoint_dir(cfg.checkpoints_root, me.name, me.uid)
    plan = submit_check.what_it_does(cfg, spec, me)
    assert plan["cwd"] == str(tmp_path) and plan["user"] == me.name and plan["gpus"] == 2
    assert any(submit_check.PORT_SHOWN in a for a in plan["argv"]) and "65535" not in " ".join(plan["argv"])
    assert plan["argv"][-3:] == ["train.py", "--lr", "0.1"]
    assert plan["checkpoint_dir"] == str(cfg.checkpoints_root / me.name / "train")
    lines = submit_check.describe(plan)
    assert [line.split(":")[0] for line in lines] == ["run", "in", "gpus", "checkpoints", "restart", " " * 13 + "per failure class", "stop"]
    assert "2 GPUs (any free ones" in lines[2]
    assert "divergence max 3, rolled back" in lines[5], lines[5]
    normal = submit_check.normalised(spec)
    assert yaml.safe_load(yaml.safe_dump(normal)) == normal and normal["checkpoints"]["dir"] == plan["checkpoint_dir"]


# --- the daemon's answer ------------------------------------------------------------------------------


def test_the_daemons_accounting_answer_shows_a_user_their_own_jobs_and_refuses_a_bad_since(tmp_path, store):
    from spx.daemon.service.answers import Answers

    cfg = DaemonConfig.rooted(tmp_path / "root")
    mine = store.jobs.add(parse_spec("name: mine\nscript: t.py\n"), 4242, "alice", "/x", 10.0)
    store.jobs.add(parse_spec("name: theirs\nscript: t.py\n"), 4343, "bob", "/x", 10.0)
    answers = Answers(cfg, store, None, None, None, lambda: None)  # type: ignore[arg-type]  # accounting reads the store alone
    reply = answers("accounting", None, 4242, "0.0")
    assert reply["ok"] and [r["job_id"] for r in reply["result"]] == [mine]
    assert {r["name"] for r in answers("accounting", None, 0, None)["result"]} == {"mine", "theirs"}  # root: all
    for bad in ("yesterday", "nan", "inf"):
        refused = answers("accounting", None, 4242, bad)
        assert (refused["ok"], refused["code"]) == (False, 2) and "Unix seconds" in refused["error"]


def test_with_no_daemon_root_reads_the_same_accounting_from_the_store(tmp_path):
    """No socket answers: root's read-only look at the store gives what the daemon would have."""
    from spx.daemon.cli import client

    cfg = DaemonConfig.rooted(tmp_path / "root")
    cfg.store_path.parent.mkdir(parents=True)
    s = Store(cfg.store_path)
    jid = s.jobs.add(parse_spec("name: offline\nscript: t.py\ngpus: 1\n"), 0, "root", "/x", 10.0)
    attempt(s, jid, 1, start=100.0, end=100.0 + 7200, peak=GIB)
    s.close()
    (rec,) = client.ask(cfg, "accounting", arg="0.0")
    assert (rec["name"], rec["gpu_hours"], rec["memory_peak_bytes"], rec["attempts"]) == ("offline", 2.0, GIB, 1)
