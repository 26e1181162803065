"""Which events become notifications, with what body, in whose lane, retried how (run/notify.py).
A real store; the lanes are a recorder whose tasks the test answers (nothing is sent here: the
sends themselves are tested with a real HTTP server and real users in tests/integration and
tests/hostile); the clock is a number the test moves."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from spx.daemon.core.config import load_config
from spx.daemon.core.lanes import Outcome
from spx.daemon.core.spec import parse_spec
from spx.daemon.run.notify import MAX_PENDING_PER_OWNER, RETRY_BACKOFF_SECONDS, Notifications
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store

HOOK = "notify:\n  webhook: http://127.0.0.1:9/hook\n  events: [failed, restarted]\n"


@dataclass
class RecordedLanes:
    tasks: list[tuple[int, str, Any]] = field(default_factory=list)
    sends: list[Any] = field(default_factory=list)  # what each task would send (its partial's argument)

    def submit(self, owner: int, kind: str, work: Any, deadline: float, on_done: Any) -> None:
        self.tasks.append((owner, kind, on_done))
        self.sends.append(work.args[0])

    def deliver(self) -> int:
        return 0  # answers come from the test (`answer`)

    def close(self) -> None:
        pass

    def answer(self, outcome: Outcome) -> list[tuple[int, str]]:
        taken, self.tasks = self.tasks, []
        for _owner, _kind, on_done in taken:
            on_done(outcome)
        return [(o, k) for o, k, _d in taken]


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def _setup(tmp_path, **cfg_overrides):
    cfg = load_config(None, tmp_path / "root").model_copy(update=cfg_overrides)
    cfg.state_dir.mkdir(parents=True)
    store = Store(cfg.store_path)
    lanes, clock = RecordedLanes(), Clock()
    return cfg, store, lanes, clock, Notifications(cfg, store, lambda: None, clock=clock, lanes=lanes)  # type: ignore[arg-type]


def _fail(store, name, extra="", uid=1000, root_cause="ValueError: bad shape"):
    jid = store.jobs.add(parse_spec(f"name: {name}\nscript: a.py\n{extra}"), uid, "alice", "/x", 1.0)
    store.jobs.transition(jid, JobState.STARTING, None, 2.0)
    row = store.attempts.start(jid, number=1, attempt_id="u1", now=2.0, resumed_from=None,
                               resumed_from_step=None, port=1)
    store.attempts.finish(jid, row, JobState.FAILED, "exit 1 (non-restartable)", 3.0,
                          {"end": 3.0, "exit_code": 1, "reason_class": "user-error", "root_cause": root_cause}, {})
    return jid


def test_a_failed_job_with_a_webhook_is_sent_in_its_owners_lane_with_its_root_cause(tmp_path):
    _cfg, store, lanes, _clock, notes = _setup(tmp_path)
    _fail(store, "train", HOOK, uid=1234)
    notes.tick()
    assert [(o, k) for o, k, _d in lanes.tasks] == [(1234, "notify-webhook")]
    send = lanes.sends[0]
    assert send.body["job"] == "train" and send.body["event"] == "failed" and send.body["state"] == "failed"
    assert send.body["root_cause"] == "ValueError: bad shape" and send.body["class"] == "user-error"
    assert send.body["attempts"] == 1 and send.body["owner"] == "alice" and "logs" in send.body["links"]
    lanes.answer(Outcome(value="HTTP 200"))
    assert ("spx_notify_sends_total", {"result": "ok"}, 1.0) in notes.samples()


def test_events_the_spec_does_not_want_and_jobs_without_notify_send_nothing(tmp_path):
    _cfg, store, lanes, _clock, notes = _setup(tmp_path)
    _fail(store, "quiet")
    jid = store.jobs.add(parse_spec("name: ok\nscript: a.py\n" + HOOK), 1000, "alice", "/x", 1.0)
    store.jobs.transition(jid, JobState.STARTING, None, 2.0)
    store.jobs.transition(jid, JobState.SUCCEEDED, None, 3.0)  # succeeded is not among its events
    notes.tick()
    assert lanes.tasks == []


def test_the_configs_default_applies_unless_the_job_opts_out(tmp_path):
    from spx.daemon.core.notify_spec import Notify
    _cfg, store, lanes, _clock, notes = _setup(tmp_path, notify=Notify(command=["true"]))
    _fail(store, "defaulted")
    _fail(store, "opted-out", "notify: {}\n")
    notes.tick()
    assert [k for _o, k, _d in lanes.tasks] == ["notify-command"]


def test_a_failed_send_is_retried_after_its_backoff_then_given_up(tmp_path):
    _cfg, store, lanes, clock, notes = _setup(tmp_path)
    _fail(store, "train", HOOK)
    notes.tick()
    for backoff in RETRY_BACKOFF_SECONDS:
        lanes.answer(Outcome(error=RuntimeError("HTTP 503")))
        clock.now += backoff - 0.5
        notes.tick()
        assert lanes.tasks == []  # not before its backoff
        clock.now += 0.5
        notes.tick()
        assert len(lanes.tasks) == 1
    lanes.answer(Outcome(error=RuntimeError("HTTP 503")))
    clock.now += 10_000
    notes.tick()
    assert lanes.tasks == []
    assert ("spx_notify_sends_total", {"result": "failed"}, 1.0) in notes.samples()


def test_one_owners_pending_sends_are_capped_others_are_not(tmp_path):
    _cfg, store, lanes, _clock, notes = _setup(tmp_path)
    for n in range(MAX_PENDING_PER_OWNER + 5):
        _fail(store, f"loop-{n}", HOOK, uid=1000)
    _fail(store, "bob", HOOK, uid=2000)
    notes.tick()
    owners = [o for o, _k, _d in lanes.tasks]
    assert owners.count(1000) == MAX_PENDING_PER_OWNER and owners.count(2000) == 1
    assert ("spx_notify_sends_total", {"result": "dropped"}, 5.0) in notes.samples()


def test_a_restart_is_told_with_its_reason(tmp_path):
    _cfg, store, lanes, _clock, notes = _setup(tmp_path)
    jid = store.jobs.add(parse_spec("name: r\nscript: a.py\n" + HOOK), 1000, "alice", "/x", 1.0)
    store.jobs.transition(jid, JobState.STARTING, None, 2.0)
    store.jobs.transition(jid, JobState.RESTARTING, "exit 1: NCCL timeout", 3.0)
    notes.tick()
    send = lanes.sends[0]
    assert send.body["event"] == "restarted" and send.body["reason"] == "exit 1: NCCL timeout"


def test_events_from_before_the_daemon_started_are_not_sent(tmp_path):
    cfg, store, lanes, clock, _notes = _setup(tmp_path)
    _fail(store, "old", HOOK)
    later = Notifications(cfg, store, lambda: None, clock=clock, lanes=lanes)  # type: ignore[arg-type]
    later.tick()
    assert lanes.tasks == []


def test_a_stored_spec_this_version_refuses_falls_back_to_the_configs_notify(tmp_path):
    from spx.daemon.core.notify_spec import Notify
    from spx.daemon.run.notify import notify_of
    _cfg, store, _lanes, _clock, _notes = _setup(tmp_path)
    jid = _fail(store, "odd", HOOK)
    row = store.jobs.get(jid)
    refused = dataclasses.replace(row, spec_problem="notify.webhook: only http")
    default = Notify(command=["true"])
    assert notify_of(refused, default) is default and notify_of(row, default) is row.spec.notify


def test_a_failures_notification_waits_for_its_incident_and_carries_it(tmp_path):
    """The incident is written a moment after the failure's event (its reads are off the loop): the
    notification waits for it, turn by turn, and carries it; one that never comes is not waited for
    past INCIDENT_WAIT_SECONDS (`incident: null`)."""
    from spx.daemon.run.notify import INCIDENT_WAIT_SECONDS

    cfg = load_config(None, tmp_path / "root")
    cfg.state_dir.mkdir(parents=True)
    store = Store(cfg.store_path)
    lanes, wall = RecordedLanes(), Clock()
    wall.now = 3.0  # the failure's event is written at 3.0 (`_fail`)
    notes = Notifications(cfg, store, lambda: None, clock=Clock(), lanes=lanes, wall=wall)  # type: ignore[arg-type]
    first = _fail(store, "train", HOOK)
    notes.tick()
    assert lanes.sends == []  # waiting for the incident
    doc = {"failed_at": 2.5, "gpus": [{"index": 2, "xids": [{"time": 2.4, "xid": 79, "what": "XID 79 on GPU 2"}],
                                       "kernel": [], "readings": [{"time": 2.0, "utilization": 0.9}]}], "stacks": None}
    store.incidents.add(first, 1, 2.5, "user-error", doc)
    wall.now = 4.0
    notes.tick()
    (send,) = lanes.sends
    assert send.body["incident"] == {**doc, "job": "train", "attempt": 1, "class": "user-error"}
    second = _fail(store, "other", HOOK)
    notes.tick()
    assert len(lanes.sends) == 1  # waiting: no incident of `other` yet
    wall.now = 3.0 + INCIDENT_WAIT_SECONDS
    notes.tick()
    assert [s.body["job"] for s in lanes.sends] == ["train", "other"] and lanes.sends[1].body["incident"] is None
    assert store.incidents.get(second, 1) is None
    store.close()


def test_a_restart_that_waited_for_its_incident_is_told_of_the_attempt_that_failed(tmp_path):
    cfg = load_config(None, tmp_path / "root")
    cfg.state_dir.mkdir(parents=True)
    store = Store(cfg.store_path)
    lanes, wall = RecordedLanes(), Clock()
    wall.now = 3.0
    notes = Notifications(cfg, store, lambda: None, clock=Clock(), lanes=lanes, wall=wall)  # type: ignore[arg-type]
    jid = store.jobs.add(parse_spec(f"name: r\nscript: a.py\n{HOOK}"), 1000, "alice", "/x", 1.0)
    store.jobs.transition(jid, JobState.STARTING, None, 2.0)
    row = store.attempts.start(jid, number=1, attempt_id="u1", now=2.0, resumed_from=None, resumed_from_step=None,
                               port=1)
    store.attempts.finish(jid, row, JobState.RESTARTING, "exit 1", 3.0,
                          {"end": 3.0, "exit_code": 1, "reason_class": "user-code", "root_cause": "ValueError: x"}, {})
    notes.tick()
    store.jobs.transition(jid, JobState.STARTING, None, 3.5)  # attempt 2 starts before the incident lands
    store.attempts.start(jid, number=2, attempt_id="u2", now=3.5, resumed_from=None, resumed_from_step=None, port=1)
    store.incidents.add(jid, 1, 3.0, "user-code", {"failed_at": 3.0, "gpus": [], "stacks": None})
    notes.tick()
    (send,) = lanes.sends
    assert send.body["event"] == "restarted" and send.body["class"] == "user-code" and send.body["attempts"] == 1
    assert send.body["incident"]["attempt"] == 1 and send.body["root_cause"] == "ValueError: x"
    store.close()
