"""The queue's rules (run/queue_rules.py) as the scheduler applies them: dependencies, holds, drain,
per-user GPU limits, and why each job waits; plus the `after:` field, dependency resolution at
intake, the drain in the STATUS line and the store migration that adds what they need."""

import sqlite3

import pytest

from spx.daemon.core.spec import SpecError, parse_spec
from spx.daemon.intake.dependencies import dependency_problem, resolve_dep
from spx.daemon.run.queue_rules import Dep, Limit, QueueFacts
from spx.daemon.run.scheduler import Start, Waiting, plan
from spx.daemon.service.status_line import format_status
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store

ALL = list(range(8))


def job(name, gpus=0, n=1, uid=1000, owner="alice", after=(), held=None):
    text = f"name: {name}\nscript: a.py\ngpus: {gpus}\n" + (f"after: [{', '.join(after)}]\n" if after else "")
    return JobRow(n, name, JobState.QUEUED, None, uid, owner, parse_spec(text), "", float(n), 0, [], 0.0, 0, 0,
                  None, held=held)


def run(queued, facts, waiting=(), held_gpus=frozenset()):
    return plan(list(queued), list(waiting), ALL, set(held_gpus), lambda g: True, "fake", facts=facts)


def test_a_job_starts_once_its_dependencies_succeeded_and_waits_while_they_run():
    b = job("b", after=["a"])
    p = run([b], QueueFacts(deps={b.id: (Dep("a", "running"),)}))
    assert p.starts == [] and p.waiting == {b.id: "waiting for dependency a (running)"}
    p = run([b], QueueFacts(deps={b.id: (Dep("a", "succeeded"),)}))
    assert p.starts == [Start(b.id, (), b)] and p.waiting == {}


def test_a_failed_or_cancelled_dependency_fails_the_job_with_its_reason_even_when_held_or_drained():
    b = job("b", after=["a", "c"], held="alice")
    facts = QueueFacts(drained="by root", deps={b.id: (Dep("a", "succeeded"), Dep("c", "failed", "exit code 3"))})
    p = run([b], facts)
    assert [(i.job.name, i.reason) for i in p.impossible] == [("b", "dependency c failed: exit code 3")]
    p = run([b], QueueFacts(deps={b.id: (Dep("a", "cancelled", "cancelled by bob"),)}))
    assert p.impossible[0].reason == "dependency a cancelled: cancelled by bob"


def test_a_held_job_waits_with_who_held_it_and_the_jobs_behind_it_start():
    held, free = job("held", 8, 1, held="bob"), job("next", 8, 2)
    p = run([held, free], QueueFacts())
    assert p.starts == [Start(free.id, tuple(ALL), free)]
    assert p.waiting == {held.id: "held by bob (spx release held)"}


def test_drain_stops_new_starts_but_relaunches_go_on():
    q = job("q", 1, 5)
    p = run([q], QueueFacts(drained="by root at 12:00"), waiting=[Waiting(9, (3,))], held_gpus={3})
    assert p.starts == [Start(9, (3,))]
    assert "drained (by root at 12:00)" in p.waiting[q.id] and "spx undrain" in p.waiting[q.id]


def test_over_the_user_limit_waits_with_the_reason_and_another_users_job_passes_it():
    a1 = job("a1", 4, 1, uid=1000, owner="alice")
    b1 = job("b1", 2, 2, uid=1001, owner="bob")
    limits = {1000: Limit(4, "default"), 1001: Limit(4, "default")}
    p = run([a1, b1], QueueFacts(usage={1000: 2}, limits=limits), held_gpus={0, 1})
    assert p.starts == [Start(b1.id, (2, 3), b1)]
    assert p.waiting[a1.id] == "waiting: alice's GPU limit (4, default): 2 in use, this job asks 4"


def test_the_limit_counts_jobs_placed_earlier_in_the_same_turn():
    a1, a2 = job("a1", 2, 1), job("a2", 2, 2)
    p = run([a1, a2], QueueFacts(limits={1000: Limit(3, "user alice")}))
    assert [s.job_id for s in p.starts] == [a1.id]
    assert "alice's GPU limit (3, user alice): 2 in use" in p.waiting[a2.id]


def test_a_job_asking_more_than_its_limit_alone_waits_and_says_so_never_fails():
    big = job("big", 8, 1)
    p = run([big], QueueFacts(limits={1000: Limit(6, "group ml")}))
    assert p.impossible == [] and p.starts == []
    assert p.waiting[big.id] == ("waiting: asks 8 GPUs, more than alice's limit of 6 (group ml); "
                                 "it starts only once the limit is raised")


def test_cpu_jobs_are_not_counted_against_gpu_limits():
    cpu = job("cpu", 0, 1)
    assert run([cpu], QueueFacts(limits={1000: Limit(0, "default")})).starts == [Start(cpu.id, (), cpu)]


def test_queued_jobs_that_wait_for_gpus_say_so_and_name_the_head_of_the_queue():
    head, behind = job("head", 8, 1), job("behind", 1, 2)
    p = run([head, behind], QueueFacts(), held_gpus={0})
    assert p.waiting == {head.id: "waiting for 8 free GPUs",
                         behind.id: "waiting behind an earlier job that waits for GPUs (no backfill)"}


def test_after_names_jobs_once_each():
    assert parse_spec("name: b\nscript: a.py\nafter: [a, x.y]\n").after == ["a", "x.y"]
    for bad, msg in (("[A]", "not a job name"), ("[a, a]", "names a job twice"), ("a", "valid list")):
        with pytest.raises(SpecError, match=msg):
            parse_spec(f"name: b\nscript: a.py\nafter: {bad}\n")


def test_an_after_name_resolves_only_to_jobs_the_submitter_can_see(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    store.jobs.add(parse_spec("name: prep\nscript: a.py\n"), 1001, "bob", "f", 1.0)
    spec = parse_spec("name: train\nscript: a.py\nafter: [prep]\n")
    assert "no job named 'prep'" in dependency_problem(store, spec, 1000, None)
    assert dependency_problem(store, spec, 1001, None) is None
    assert dependency_problem(store, spec, 0, None) is None  # root sees every job
    store.close()


def test_an_after_name_finds_the_submitters_job_behind_any_number_of_newer_ones_of_others(tmp_path):
    """65 newer same-name jobs of another user must not hide one's own (they once did: the newest 64
    were read first and filtered by owner after)."""
    store = Store(tmp_path / "s.sqlite")
    prep = parse_spec("name: prep\nscript: a.py\n")
    mine = store.jobs.add(prep, 1000, "alice", "f", 1.0)
    store.jobs.transition(mine, JobState.CANCELLED, "cancelled", 1.0)
    for i in range(65):
        theirs = store.jobs.add(prep, 1001, "bob", "f", 2.0 + i)
        store.jobs.transition(theirs, JobState.CANCELLED, "cancelled", 2.0 + i)
    after = store.jobs.add(parse_spec("name: train\nscript: a.py\nafter: [prep]\n"), 1000, "alice", "f", 100.0)
    found = resolve_dep(store, "prep", after, 1000, None)
    assert found is not None and found.id == mine
    assert dependency_problem(store, parse_spec("name: t2\nscript: a.py\nafter: [prep]\n"), 1000, None) is None
    assert resolve_dep(store, "prep", after, 0, None).id == theirs  # root: anyone's, the newest
    assert resolve_dep(store, "prep", mine, 1000, None) is None  # only jobs submitted before count
    store.close()


def test_drain_in_the_status_line():
    text = format_status([], 8, None, 0.0, drained="by root at 12:00")
    assert text.startswith("DRAINED (by root at 12:00): no new starts; 0 running")


def test_an_existing_store_gains_the_hold_column_and_the_drain_table(tmp_path):
    path = tmp_path / "s.sqlite"
    store = Store(path)
    store.jobs.add(parse_spec("name: old\nscript: a.py\n"), 1000, "alice", "f", 1.0)
    store.close()
    db = sqlite3.connect(path)  # make it what an older daemon wrote
    db.execute("ALTER TABLE jobs DROP COLUMN held")
    db.execute("DROP TABLE queue_settings")
    db.execute("PRAGMA user_version = 0")
    db.commit()
    db.close()
    store = Store(path)
    (old,) = store.jobs.live()
    assert old.held is None and store.host.drained() is None
    store.jobs.update(old.id, 2.0, held="alice")
    store.host.set_drained("by root", 2.0)
    store.close()
    store = Store(path)
    assert store.jobs.live()[0].held == "alice" and store.host.drained() == "by root"
    store.host.set_drained(None, 3.0)
    assert store.host.drained() is None
    store.close()
