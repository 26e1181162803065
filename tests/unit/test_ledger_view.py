"""state/ledger_view.py: a job's ledger from its store rows (what `spx status --json` shows as
`ledger`) and the host's GPU-seconds (`spx_host_gpu_seconds_total`), from a real store written as the
daemon writes it."""

from __future__ import annotations

import os

import pytest

from spx.daemon.core.spec import parse_spec
from spx.daemon.state import ledger_view
from spx.daemon.state.attempt_progress import Progress
from spx.daemon.state.jobviews import job_view
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "spx.sqlite")
    yield s
    s.close()


def crashed_once(store: Store) -> int:
    """Submitted at 100, GPUs at 110, attempt 1 trains 120 → 180 (saves step 50 at 150) and
    crashes; attempt 2 resumes from step 50 and finishes at 300."""
    job = store.jobs.add(parse_spec("name: l\nscript: /bin/true\ngpus: 2\n"), os.getuid(), "u", "/spool/l", 100.0)
    store.jobs.transition(job, JobState.STARTING, "GPUs allocated", 110.0, gpus=[0, 1])
    one = store.attempts.start(job, number=1, attempt_id="a1", now=112.0, resumed_from=None, resumed_from_step=None,
                               port=None)
    store.attempts.add_phases(one, {"placed": 110.0, "spawn": 112.0, "launcher_exit": 182.0, "failure_seen": 183.0})
    store.attempts.running(job, one, pgid=1, boot_id=None, start_ticks=None, reason="running", now=112.0)
    store.attempts.set_progress(one, Progress(first=(120.0, 1), last=(180.0, 80), saves=((50, 150.0),),
                                              kept=(150.0, 0.0)).to_json())
    store.attempts.finish(job, one, JobState.RESTARTING, "exit code 1", 185.0,
                          {"end": 185.0, "reason_class": "user-code", "backoff": 5.0}, {})
    store.jobs.transition(job, JobState.STARTING, "relaunching", 192.0)
    two = store.attempts.start(job, number=2, attempt_id="a2", now=195.0, resumed_from="/c/50", resumed_from_step=50,
                               port=None)
    store.attempts.add_phases(two, {"placed": 192.0, "spawn": 195.0, "launcher_exit": 298.0, "failure_seen": 299.0})
    store.attempts.running(job, two, pgid=2, boot_id=None, start_ticks=None, reason="running", now=195.0)
    store.attempts.set_progress(two, Progress(first=(205.0, 51), last=(297.0, 200)).to_json())
    store.attempts.finish(job, two, JobState.SUCCEEDED, "exit code 0", 300.0, {"end": 300.0}, {"gpus": []})
    return job


def test_a_finished_jobs_ledger_from_the_store_sums_to_its_wall_time(store, tmp_path):
    job = store.jobs.get(crashed_once(store))
    ledger = job_view(store, job, tmp_path / "run").to_json()["ledger"]
    assert ledger["wall_seconds"] == 200 and ledger["gpus"] == 2 and ledger["unsettled_seconds"] == 0
    assert sum(ledger["seconds"].values()) == pytest.approx(200)
    assert {k: v for k, v in ledger["seconds"].items() if v} == {
        "queued": 10, "startup": 10, "productive": 30 + 92, "recomputed": 30, "restart_detect": 3,
        "restart_teardown": 2, "backoff": 5, "restart_placed": 2, "restart_relaunch": 3, "restart_restore": 10,
        "shutdown": 3}
    assert ledger["gpu_seconds"]["recomputed"] == 60


def test_the_hosts_gpu_seconds_count_the_jobs_the_quarantined_and_the_idle(store):
    crashed_once(store)
    store.host.quarantine_gpu(7, None, "XID 79", 250.0)
    account = ledger_view.HostAccount(store, since=200.0)
    host = account.gpu_seconds(8, now=400.0).settled
    assert sum(host.values()) == pytest.approx(8 * 200)
    assert host["productive"] == pytest.approx(2 * (297 - 205))
    assert host["quarantined"] == pytest.approx(150)
    assert host["idle"] == pytest.approx(1600 - 2 * 100 - 150)
    assert account.gpu_seconds(8, now=400.0).settled == host  # the ended job, kept, counts the same
    # Released at 420: the GPU's quarantined time stays (its span ends when a scrape sees it gone).
    store.host.release_gpu(7, "root", 420.0)
    later = account.gpu_seconds(8, now=430.0).settled
    assert later["quarantined"] == pytest.approx(180) and later["idle"] == pytest.approx(1600 + 240 - 200 - 180)


def test_an_ended_jobs_ledger_is_accounted_once_and_a_live_ones_at_every_read(store, tmp_path, monkeypatch):
    """Every `spx ls` and scrape shows the jobs that ended in the last day: their ledgers no longer
    change, so each is accounted at its first read only; a live job's is accounted afresh."""
    from spx.daemon.state import jobviews

    ended = crashed_once(store)
    live = store.jobs.add(parse_spec("name: q\nscript: /bin/true\n"), os.getuid(), "u", "/spool/q", 310.0)
    accounted: list[float] = []
    account = ledger_view.goodput.account
    monkeypatch.setattr(ledger_view.goodput, "account", lambda facts, now: accounted.append(facts.submitted) or account(facts, now))
    first = {v.name: v.ledger for v in jobviews.all_views(store, tmp_path / "run", scope="all")}
    second = {v.name: v.ledger for v in jobviews.all_views(store, tmp_path / "run", scope="all")}
    assert first["l"] == second["l"] and first["l"]["wall_seconds"] == 200
    assert accounted.count(100.0) == 1, "the ended job's ledger was accounted again"
    assert accounted.count(310.0) == 2, "a live job's ledger is accounted at every read"
    assert store.jobs.get(ended).state.terminal and not store.jobs.get(live).state.terminal


def test_the_hosts_account_takes_the_live_ledgers_a_scrape_already_computed(store, tmp_path, monkeypatch):
    """A scrape's job views compute each live job's ledger; the host's account at the same `now`
    takes those instead of reading each live job's attempts and ledger again, and gets what it
    would have computed; a job that ended after the views were read counts once, as ended."""
    from spx.daemon.state import jobviews

    crashed_once(store)
    running = store.jobs.add(parse_spec("name: r\nscript: /bin/true\ngpus: 4\n"), os.getuid(), "u", "/spool/r", 300.0)
    store.jobs.transition(running, JobState.STARTING, "GPUs allocated", 310.0, gpus=[2, 3, 4, 5])
    store.jobs.add(parse_spec("name: q\nscript: /bin/true\ngpus: 8\n"), os.getuid(), "u", "/spool/q", 320.0)
    fresh = ledger_view.HostAccount(store, since=200.0).gpu_seconds(8, now=400.0)
    ledgers: dict = {}
    views = jobviews.all_views(store, tmp_path / "run", now=400.0, ledgers=ledgers)
    assert {v.name for v in views} == {"l", "r", "q"} and set(ledgers) == {running, running + 1}
    reads: list[int] = []
    real = store.attempts.for_job
    monkeypatch.setattr(store.attempts, "for_job", lambda job_id: reads.append(job_id) or real(job_id))
    shared = ledger_view.HostAccount(store, since=200.0)
    assert shared.gpu_seconds(8, now=400.0, live=ledgers) == fresh
    assert running not in reads and running + 1 not in reads  # the live ones: not read again
    store.jobs.transition(running, JobState.FAILED, "ended after the views", 405.0)
    ended = ledger_view.HostAccount(store, since=200.0).gpu_seconds(8, now=410.0)
    assert shared.gpu_seconds(8, now=410.0, live=ledgers).settled["startup"] == ended.settled["startup"]


def test_the_hosts_account_of_ended_jobs_is_a_running_sum_reading_only_the_newly_ended(store, monkeypatch):
    """The soak found the account holding every ended job's ledger for the daemon's life and reading
    all their ids back on every scrape: now each ended job is read once, into a sum, and a read reads
    only the jobs that ended since the last one (ties at the same instant included, none twice)."""
    crashed_once(store)
    account = ledger_view.HostAccount(store, since=200.0)
    first = account.gpu_seconds(8, now=400.0)
    reads: list[int] = []
    real = store.attempts.for_job
    monkeypatch.setattr(store.attempts, "for_job", lambda job_id: reads.append(job_id) or real(job_id))
    assert account.gpu_seconds(8, now=400.0) == first and reads == []  # nothing ended since: nothing read
    for n in range(3):  # three jobs end at the same instant
        job = store.jobs.add(parse_spec(f"name: e{n}\nscript: /bin/true\n"), os.getuid(), "u", "/spool/e", 401.0)
        store.jobs.transition(job, JobState.CANCELLED, "cancelled by u", 402.0)
    account.gpu_seconds(8, now=403.0)
    assert len(reads) == 3
    account.gpu_seconds(8, now=404.0)
    assert len(reads) == 3, "an ended job was read again"
    for n in range(30):  # thirty more, one after another
        job = store.jobs.add(parse_spec(f"name: f{n}\nscript: /bin/true\n"), os.getuid(), "u", "/spool/f", 403.0)
        store.jobs.transition(job, JobState.CANCELLED, "cancelled by u", 403.0 + n / 100)
    account.gpu_seconds(8, now=404.0)
    assert len(reads) == 33
    held = {k: len(v) for k, v in vars(account).items() if isinstance(v, dict | set | list)}
    assert max(held.values()) < 10, f"the account keeps something per ended job: {held}"
    assert account.gpu_seconds(8, now=404.0).settled == ledger_view.HostAccount(store, since=200.0).gpu_seconds(
        8, now=404.0).settled  # the sum is what a fresh account computes
