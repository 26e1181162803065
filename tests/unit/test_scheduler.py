from spx.daemon.core.spec import parse_spec
from spx.daemon.run.scheduler import Start, Waiting, impossible_reason, place, plan
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.states import JobState


def job(name, gpus, n=0):
    spec = parse_spec(f"name: {name}\nscript: a.py\ngpus: {gpus}\n")
    return JobRow(n, name, JobState.QUEUED, None, 0, "root", spec, "", float(n), 0, [], 0.0, 0, 0, None)


def test_two_small_jobs_share_the_host_on_disjoint_gpus_and_the_big_one_waits():
    placed = place([job("a", 2, 1), job("b", 2, 2), job("c", 8, 3)], set(range(8)))
    assert [(p.job.name, p.gpus) for p in placed] == [("a", [0, 1]), ("b", [2, 3])]


def test_no_backfill_past_a_waiting_gpu_job_but_cpu_jobs_pass():
    placed = place([job("big", 8, 1), job("small", 1, 2), job("cpu", 0, 3)], {0, 1, 2})
    assert [p.job.name for p in placed] == ["cpu"]


def test_explicit_gpu_list():
    assert place([job("x", "[4, 5]")], {4, 5, 6})[0].gpus == [4, 5]
    assert place([job("x", "[4, 5]")], {5, 6}) == []


def test_impossible_jobs_say_why():
    assert "needs 8 GPUs, this host has 0" in impossible_reason(job("x", 8), [], "none")
    assert "[9]" in impossible_reason(job("x", "[9]"), list(range(8)), "fake")
    assert impossible_reason(job("x", 2), list(range(8)), "fake") is None


def test_plan_relaunches_a_waiting_job_only_once_its_own_gpus_are_idle():
    busy = {2}
    p = plan([], [Waiting(7, (2, 3)), Waiting(8, (4,))], list(range(8)), {2, 3, 4}, lambda g: g not in busy, "fake")
    assert p.starts == [Start(8, (4,))]
    busy.clear()
    p = plan([], [Waiting(7, (2, 3))], list(range(8)), {2, 3}, lambda g: g not in busy, "fake")
    assert p.starts == [Start(7, (2, 3))]


def test_plan_places_queued_jobs_around_held_and_busy_gpus_and_reports_impossible_ones():
    a, big = job("a", 2, 1), job("big", 9, 2)
    p = plan([a, big], [], list(range(4)), {0}, lambda g: g != 1, "fake")
    assert p.starts == [Start(a.id, (2, 3), a)]
    assert [(i.job.name, "this host has 4" in i.reason) for i in p.impossible] == [("big", True)]


def test_plan_starts_at_most_its_limit_per_turn_relaunches_first():
    cpu = [job(f"c{n}", 0, n) for n in range(10, 20)]
    p = plan(cpu, [Waiting(1, ())], [], set(), lambda g: True, "none", limit=4)
    assert [s.job_id for s in p.starts] == [1, 10, 11, 12]


def test_plan_asks_no_gpu_when_nothing_waits():
    asked = []
    assert plan([], [], list(range(8)), set(), lambda g: asked.append(g) or True, "fake").starts == []
    assert asked == []


def test_plan_never_allocates_a_quarantined_gpu():
    a = job("a", 2, 1)
    p = plan([a], [], list(range(4)), set(), lambda g: True, "fake", quarantined=frozenset({0}))
    assert p.starts == [Start(a.id, (1, 2), a)]


def test_plan_places_a_relaunch_off_its_quarantined_gpu_onto_healthy_ones():
    # Job 7 ran on 0-3; GPU 3 was quarantined; 4-7 are free, 5 busy with another job.
    p = plan([], [Waiting(7, (0, 1, 2, 3), want=4)], list(range(8)), {0, 1, 2, 3, 5}, lambda g: True, "fake",
             quarantined=frozenset({3}))
    assert p.starts == [Start(7, (0, 1, 2, 4))] and p.waiting == {}


def test_plan_keeps_a_relaunch_waiting_with_a_reason_when_too_few_healthy_gpus_are_free():
    p = plan([], [Waiting(7, (0, 1, 2, 3), want=4)], list(range(4)), {0, 1, 2, 3}, lambda g: True, "fake",
             quarantined=frozenset({3}))
    assert p.starts == [] and p.waiting == {7: "waiting: GPU 3 quarantined; 3 of 4 healthy GPUs free"}
    named = plan([], [Waiting(8, (2, 3))], list(range(8)), {2, 3}, lambda g: True, "fake", quarantined=frozenset({3}))
    assert named.starts == [] and "names its GPUs" in named.waiting[8]


def test_a_queued_job_does_not_take_the_gpus_a_relaunch_was_placed_on():
    q = job("q", 2, 9)
    p = plan([q], [Waiting(7, (0, 1), want=2)], list(range(4)), {0, 1}, lambda g: True, "fake",
             quarantined=frozenset({1}))
    assert p.starts == [Start(7, (0, 2))]
