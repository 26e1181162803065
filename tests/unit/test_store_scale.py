"""The store's reads that run every turn, every `spx ls` and every scrape do not read the whole
history: each is answered from an index (the live jobs' `jobs_live`, the finished ones' `jobs_ended`,
names' `jobs_name`), checked on SQLite's own query plan of the statements they run; and the rewritten
`current` answers what a per-name reading of the rules gives, on a history with reused names."""

from __future__ import annotations

import random

from spx.daemon.core.spec import JobSpec
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store

END = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


def spec(name: str) -> JobSpec:
    return JobSpec.model_validate({"name": name, "launcher": "python", "script": "t.py"})


def history(store: Store, rng: random.Random, jobs: int) -> None:
    """`jobs` jobs of a few reused names: most finished (at times not in id order), some live."""
    for i in range(jobs):
        name = f"n{rng.randrange(12)}"
        if store.jobs.by_name(name) is not None and not store.jobs.by_name(name).state.terminal:
            continue  # a live job of that name already: intake would refuse this one
        job = store.jobs.add(spec(name), 0, "root", f"/x/{i}", float(i))
        if rng.random() < 0.85:
            store.jobs.transition(job, JobState.STARTING, None, float(i))
            store.jobs.transition(job, rng.choice(END), None, rng.uniform(0, 2 * jobs))


def plans(store: Store, read) -> list[str]:
    """SQLite's query plan of every statement `read()` runs on this thread's connection."""
    statements: list[str] = []
    conn = store.db.conn
    conn.set_trace_callback(statements.append)
    try:
        read()
    finally:
        conn.set_trace_callback(None)
    return [" / ".join(str(r[3]) for r in conn.execute(f"EXPLAIN QUERY PLAN {s}"))
            for s in statements if s.lstrip().upper().startswith("SELECT")]


def test_the_reads_of_every_turn_and_scrape_never_scan_the_jobs_table(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    history(store, random.Random(1), 300)
    for name, read in {"live": store.jobs.live, "current": lambda: store.jobs.current(100.0),
                       "current_limited": lambda: store.jobs.current(100.0, ended_limit=20),
                       "ended_ids_since": lambda: store.jobs.ended_ids_since(100.0),
                       "ended_since": lambda: store.jobs.ended_since(100.0),
                       "active_since": lambda: store.jobs.active_since(100.0)}.items():
        found = plans(store, read)
        assert found, name
        for plan in found:
            scans = [step for step in plan.split(" / ") if step.startswith("SCAN") and "INDEX" not in step]
            assert not scans, f"{name} reads the whole jobs table: {plan}"


def test_current_is_each_names_by_name_job_unless_it_ended_before_the_cutoff(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    rng = random.Random(7)
    history(store, rng, 400)
    every = store.jobs.all()
    for cutoff in (0.0, 150.0, 400.0, 900.0):
        expected = []
        for name in sorted({j.name for j in every}):
            job = store.jobs.by_name(name)
            if job is not None and (not job.state.terminal or store.db.conn.execute(
                    "SELECT updated FROM jobs WHERE id = ?", (job.id,)).fetchone()[0] >= cutoff):
                expected.append(job.id)
        assert [j.id for j in store.jobs.current(cutoff)] == sorted(expected)
        # With a limit: every live one, and of the ended ones the newest by their end (ties by id).
        ended = sorted((i for i in expected if store.jobs.get(i).state.terminal),
                       key=lambda i: store.db.conn.execute("SELECT updated, id FROM jobs WHERE id = ?", (i,)).fetchone(),
                       reverse=True)
        for limit in (0, 1, 7, len(ended) + 3):
            kept = [i for i in expected if not store.jobs.get(i).state.terminal] + ended[:limit]
            assert [j.id for j in store.jobs.current(cutoff, ended_limit=limit)] == sorted(kept)
    assert [j.id for j in store.jobs.live()] == [j.id for j in sorted(
        (j for j in every if not j.state.terminal), key=lambda j: (-j.priority, j.submitted, j.id))]


def test_a_stored_spec_is_parsed_once_however_often_the_live_jobs_are_read(tmp_path, monkeypatch):
    """The scheduler, `spx ls` and every scrape read the live jobs; a spec never changes after intake,
    so each is validated once, not once per read; a changed text (an upgrade's rewrite) is read anew;
    the parsed copies are held for the live jobs only."""
    store = Store(tmp_path / "s.sqlite")
    ids = [store.jobs.add(spec(f"j{i}"), 0, "root", f"/x/{i}", float(i)) for i in range(20)]
    parsed: list[str] = []
    real = JobSpec.model_validate_json.__func__  # type: ignore[attr-defined]

    def counting(cls, raw, *a, **k):
        parsed.append(raw)
        return real(cls, raw, *a, **k)

    monkeypatch.setattr(JobSpec, "model_validate_json", classmethod(counting))
    first = store.jobs.live()
    for _ in range(5):
        assert [j.spec for j in store.jobs.live()] == [j.spec for j in first]
    assert store.jobs.get(ids[3]).spec.name == "j3"
    assert len(parsed) == len(ids)  # once each
    with store.db.write(None) as db:
        db.execute("UPDATE jobs SET spec_json = ? WHERE id = ?", (spec("renamed").model_dump_json(), ids[0]))
    assert store.jobs.get(ids[0]).spec.name == "renamed"
    # Kept while live only: an ended job's spec is let go at the next read of the live jobs, and is
    # parsed whenever it is read again rather than held for the daemon's life.
    store.jobs.transition(ids[5], JobState.CANCELLED, "cancelled", 30.0)
    store.jobs.live()
    assert ids[5] not in store.jobs._specs._kept and len(store.jobs._specs._kept) == len(ids) - 1
    parsed.clear()
    for _ in range(3):
        assert store.jobs.get(ids[5]).spec.name == "j5"
    assert len(parsed) == 3 and ids[5] not in store.jobs._specs._kept
    store.close()


def test_the_status_lines_read_of_the_live_jobs_is_one_statement_and_no_spec(tmp_path, monkeypatch):
    """The STATUS line counts the live jobs every few seconds on the main loop: one statement over
    the live index, no spec parsed and nothing read per job, however long the queue."""
    from spx.daemon.service.status_line import format_status

    store = Store(tmp_path / "s.sqlite")
    for i in range(30):
        job = store.jobs.add(spec(f"j{i}"), 0, "root", f"/x/{i}", float(i))
        if i < 3:
            store.jobs.transition(job, JobState.STARTING, None, 40.0, gpus=[2 * i, 2 * i + 1])
    monkeypatch.setattr(JobSpec, "model_validate_json", None)  # any parse would raise
    statements = plans(store, store.jobs.live_states)
    assert len(statements) == 1 and "jobs_live" in statements[0]
    assert format_status(store.jobs.live_states(), 8, None, 0.0) == "0 running, 3 starting, 27 queued, 6/8 GPUs busy"
    store.close()


def test_a_queued_jobs_view_costs_two_statements(tmp_path):
    """`spx ls` and each scrape build a view per job: its attempts and its allocation/end events are
    read, its restarts counted from those attempts (no statement of its own), however long the queue."""
    from spx.daemon.state import jobviews

    store = Store(tmp_path / "s.sqlite")
    for i in range(25):
        store.jobs.add(spec(f"j{i}"), 0, "root", f"/x/{i}", float(i))
    statements: list[str] = []
    store.db.conn.set_trace_callback(statements.append)
    views = jobviews.all_views(store, tmp_path / "run", now=100.0)
    store.db.conn.set_trace_callback(None)
    assert len(views) == 25 and all(v.restarts_by_reason == {} for v in views)
    assert len(statements) == 2 + 2 * 25, statements[:8]  # the live jobs, the ended ones, then 2 per view
    store.close()


def test_a_scrape_shows_the_newest_ended_jobs_up_to_its_limit_and_builds_each_once(tmp_path):
    """/metrics shows every live job and the `metrics_ended_jobs` that ended last; an ended job's view
    is built at the first scrape that shows it and found at the next ones (it no longer changes), built
    again if its row changed, and let go once it is no longer shown."""
    from spx.daemon.state import jobviews

    store = Store(tmp_path / "s.sqlite")
    live = store.jobs.add(spec("live"), 0, "root", "/x/live", 0.0)
    ended = []
    for i in range(10):
        job = store.jobs.add(spec(f"e{i}"), 0, "root", f"/x/{i}", float(i))
        store.jobs.transition(job, JobState.STARTING, None, float(i))
        store.jobs.transition(job, JobState.SUCCEEDED, "done", 1000.0 + i)
        ended.append(job)
    kept = jobviews.EndedViews(limit=4)

    def shown() -> list[str]:
        return [v.name for v in jobviews.all_views(store, tmp_path / "run", now=2000.0, kept=kept)]

    assert shown() == ["live", "e6", "e7", "e8", "e9"] and kept.built == 4
    assert shown() == ["live", "e6", "e7", "e8", "e9"] and kept.built == 4  # found, not built
    store.jobs.transition(live, JobState.CANCELLED, "cancelled by root", 1500.0)  # ends last: e6 drops out
    assert shown() == ["live", "e7", "e8", "e9"] and kept.built == 5
    assert set(kept._kept) == {live, *ended[7:]}
    every = ["live"] + [f"e{i}" for i in range(10)]  # `spx ls`: no limit
    assert [v.name for v in jobviews.all_views(store, tmp_path / "run", now=2000.0)] == every
    store.close()
