"""core/lanes.py: off-loop work is fair by owner, its deadlines count from its start, and its answers
come back on the thread that delivers them. Threads and events only; time is a fake clock."""

from __future__ import annotations

import threading

import pytest

from spx.daemon.core.lanes import Lanes, Outcome, Overdue

WAIT = 10.0  # seconds a test waits for a worker thread to reach a point (never reached when all is well)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Gate:
    """Work that says when it started and runs until opened."""

    def __init__(self, name: str, log: list[str] | None = None) -> None:
        self.name = name
        self.started = threading.Event()
        self.opened = threading.Event()
        self.log = log

    def __call__(self) -> str:
        if self.log is not None:
            self.log.append(self.name)
        self.started.set()
        assert self.opened.wait(WAIT), f"{self.name} was never opened"
        return self.name


@pytest.fixture
def lanes():
    made: list[Lanes] = []

    def make(total: int, per_owner: int, clock: Clock | None = None, wake=lambda: None) -> Lanes:
        made.append(Lanes(total, per_owner, wake=wake, clock=clock or Clock()))
        return made[-1]

    yield make
    for lane in made:
        lane.close(wait=WAIT)


def settle(lane: Lanes, running: int) -> None:
    """Wait until `running` tasks hold slots (the workers took what they could)."""
    done = threading.Event()
    for _ in range(int(WAIT * 100)):
        if sum(r for r, _q in lane.counts().values()) == running:
            return
        done.wait(0.01)
    raise AssertionError(f"lanes never settled at {running} running: {lane.counts()}")


def test_one_owner_never_takes_more_than_its_slots_and_another_owner_starts_at_once(lanes):
    lane = lanes(total=4, per_owner=2)
    alice = [Gate(f"a{i}") for i in range(6)]
    for gate in alice:
        lane.submit(1000, "intake", gate, 60, lambda _o: None)
    settle(lane, 2)
    assert lane.counts() == {1000: (2, 4)}
    bob = Gate("b0")
    lane.submit(1001, "discovery", bob, 60, lambda _o: None)
    assert bob.started.wait(WAIT), "bob's task waited behind alice's queue"
    assert lane.counts() == {1000: (2, 4), 1001: (1, 0)}
    for gate in [*alice, bob]:
        gate.opened.set()


def test_free_slots_go_round_robin_over_owners_not_to_whoever_queued_most(lanes):
    lane = lanes(total=1, per_owner=1)
    order: list[str] = []
    blocker = Gate("x", order)
    lane.submit(1, "x", blocker, 60, lambda _o: None)
    assert blocker.started.wait(WAIT)
    gates = {name: Gate(name, order) for name in ("a1", "a2", "a3", "b1", "c1")}
    for name, gate in gates.items():
        lane.submit({"a": 10, "b": 20, "c": 30}[name[0]], "t", gate, 60, lambda _o: None)
    blocker.opened.set()
    for name in ("a1", "b1", "c1", "a2", "a3"):
        assert gates[name].started.wait(WAIT), f"{name} never started; order so far {order}"
        gates[name].opened.set()
    assert order == ["x", "a1", "b1", "c1", "a2", "a3"]


def test_the_deadline_counts_from_the_start_not_from_the_queue(lanes):
    clock = Clock()
    lane = lanes(total=1, per_owner=1, clock=clock)
    blocker, queued = Gate("blocker"), Gate("queued")
    answers: list[Outcome] = []
    lane.submit(1, "t", blocker, 1000, lambda _o: None)
    assert blocker.started.wait(WAIT)
    lane.submit(2, "discovery", queued, 10, answers.append)
    clock.now = 100.0  # queued for 100 s, far past its 10-s deadline: not overdue, it has not started
    assert lane.deliver() == 0
    blocker.opened.set()
    assert queued.started.wait(WAIT)
    clock.now = 105.0
    lane.deliver()
    assert answers == []
    clock.now = 111.0  # 11 s after its start
    lane.deliver()
    assert len(answers) == 1 and answers[0].overdue and isinstance(answers[0].error, Overdue)
    assert "discovery did not finish in 10 s" in str(answers[0].error)
    # Its thread still holds the owner's slot until the work returns; then no second answer.
    assert lane.counts()[2] == (1, 0)
    queued.opened.set()
    settle(lane, 0)
    lane.deliver()
    assert len(answers) == 1


def test_answers_run_on_the_delivering_thread_with_the_value_or_the_error(lanes):
    woke = threading.Event()  # the lanes' wake: a task finished (as the main loop is woken)
    lane = lanes(total=2, per_owner=2, wake=woke.set)
    seen: list[tuple[Outcome, str]] = []

    def boom() -> None:
        raise OSError("the volume is gone")

    lane.submit(5, "ok", lambda: 42, 60, lambda o: seen.append((o, threading.current_thread().name)))
    lane.submit(5, "bad", boom, 60, lambda o: seen.append((o, threading.current_thread().name)))
    while len(seen) < 2:
        assert woke.wait(WAIT), f"a task never finished: {seen}"
        woke.clear()
        lane.deliver()
    by_value = sorted(seen, key=lambda s: s[0].value is None)
    assert by_value[0][0].ok and by_value[0][0].value == 42
    assert isinstance(by_value[1][0].error, OSError) and not by_value[1][0].ok
    assert {name for _o, name in seen} == {threading.current_thread().name}


def test_a_cancelled_task_never_runs_and_close_drops_what_is_queued(lanes):
    lane = lanes(total=1, per_owner=1)
    blocker, dropped, left = Gate("b"), Gate("d"), Gate("l")
    answers: list[Outcome] = []
    lane.submit(1, "t", blocker, 60, answers.append)
    assert blocker.started.wait(WAIT)
    task = lane.submit(1, "t", dropped, 60, answers.append)
    lane.submit(2, "t", left, 60, answers.append)
    assert lane.cancel(task) is True
    assert lane.counts() == {1: (1, 0), 2: (0, 1)}
    lane.close()
    blocker.opened.set()
    lane.close(wait=WAIT)
    lane.deliver()
    assert not dropped.started.is_set() and not left.started.is_set()
    assert [o.value for o in answers] == ["b"]
    with pytest.raises(RuntimeError):
        lane.submit(1, "t", lambda: None, 60, answers.append)
