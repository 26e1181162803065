"""run/user_work.py: the executor's work in the owners' lanes — answers come back as observations on
the delivering thread, work the machine has a deadline on says when it waits for a slot and when it
got one, and a forgotten job's work is dropped (or, when it owns processes, still ended) without an
observation. Threads and events only; time is a fake clock."""

from __future__ import annotations

import threading

import pytest
from test_lanes import Clock

from spx.daemon.core.lanes import Lanes
from spx.daemon.core.spec import parse_spec
from spx.daemon.lifecycle.actions import FindCheckpoint
from spx.daemon.lifecycle.observations import Diagnosed, WorkQueued, WorkStarted
from spx.daemon.run.user_work import QUEUED_REPORT_SECONDS, UserWork
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.states import JobState

WAIT = 10.0


def job(job_id: int, owner: int) -> JobRow:
    return JobRow(id=job_id, name=f"job{job_id}", state=JobState.STARTING, reason=None, owner_uid=owner, owner="u",
                  spec=parse_spec(f"name: job{job_id}\nscript: /bin/true\n"), spec_file="/s", submitted=0.0,
                  priority=0, gpus=[], backoff_remaining=0.0, no_progress_streak=0, backoff_level=0, staging=None)


WOKEN = threading.Event()  # the lanes' wake: a task finished (the loop would turn)


@pytest.fixture
def work():
    clock = Clock()
    WOKEN.clear()
    lanes = Lanes(total=4, per_owner=1, wake=WOKEN.set, clock=clock)
    yield UserWork(lanes, clock), clock
    lanes.close(wait=WAIT)


def next_answers(w: UserWork) -> list:
    """What the next finished task gave, delivered as the loop delivers it."""
    assert WOKEN.wait(WAIT), "no task finished"
    WOKEN.clear()
    return w.results()


def started(w: UserWork, owner: int, running: int) -> None:
    """Until `running` of the owner's tasks hold slots (a slot freed is taken before the wake)."""
    for _ in range(int(WAIT * 100)):
        if w.lanes.counts().get(owner, (0, 0))[0] == running and not w.lanes.counts().get(owner, (0, 0))[1]:
            return
        WOKEN.wait(0.01)
    raise AssertionError(f"the lane never ran {running} task(s) of uid {owner}: {w.lanes.counts()}")


def test_a_task_waiting_behind_its_owners_other_work_says_so_and_then_that_it_started(work):
    w, clock = work
    busy, blocker = threading.Event(), threading.Event()
    w.submit(job(1, 1000), "stack dump", lambda: (busy.set(), blocker.wait(WAIT)), 60.0, lambda o: None)
    assert busy.wait(WAIT)
    find = FindCheckpoint(1)
    w.submit(job(2, 1000), "checkpoint discovery", lambda: "found", 120.0, lambda o: Diagnosed(1, o.value, False),
             action=find)
    assert w.observe(2) == [], "not reported before it waited a while"
    clock.now += QUEUED_REPORT_SECONDS
    queued = w.observe(2)
    assert [type(o) for o in queued] == [WorkQueued] and queued[0].action == find
    assert "uid 1000 has 1 tasks running and 1 waiting" in queued[0].detail
    assert w.observe(2) == [], "said once"
    blocker.set()
    answers = next_answers(w)
    answers += [] if answers else next_answers(w)
    assert answers == [(2, Diagnosed(1, "found", False))]
    assert w.observe(2) == [], "answered: nothing more to say (the answer itself is the news)"


def test_work_that_started_after_waiting_reports_its_start_before_its_answer(work):
    w, clock = work
    blocker, go = threading.Event(), threading.Event()
    w.submit(job(1, 7), "a", lambda: blocker.wait(WAIT), 60.0, lambda o: None)
    find = FindCheckpoint(3)
    w.submit(job(2, 7), "b", lambda: go.wait(WAIT), 60.0, lambda o: None, action=find)
    clock.now += QUEUED_REPORT_SECONDS
    assert [type(o) for o in w.observe(2)] == [WorkQueued]
    blocker.set()
    started(w, 7, 1)
    assert w.observe(2) == [WorkStarted(find)]
    go.set()


def test_a_forgotten_jobs_queued_work_is_dropped_and_kept_work_still_ends_without_an_observation(work):
    w, clock = work
    blocker = threading.Event()
    ran, cleaned = [], []
    w.submit(job(1, 5), "launch", lambda: blocker.wait(WAIT), 60.0,
             lambda o: cleaned.append(o.ok) or Diagnosed(1, None, False), keep=True)
    w.submit(job(1, 5), "discovery", lambda: ran.append(1), 60.0, lambda o: Diagnosed(1, None, False))
    w.forget(1)
    blocker.set()
    assert next_answers(w) == [], "a forgotten job's answer gives no observation"
    assert cleaned == [True] and ran == [], "the kept task ended (its cleanup ran), the queued one never started"
