"""exporter/scrape_jobs.py: a scrape reads the jobs' views once, at one `now`, and its parts (the
GPU part, the job part, the host's account) share them; outside a scrape every call reads; two
scrapes on two threads at once each read their own."""

from __future__ import annotations

import threading

from spx.daemon.exporter.scrape_jobs import ScrapeJobs
from spx.daemon.state.goodput import Ledger
from spx.daemon.state.views import JobView


def view(name: str) -> JobView:
    return JobView(name=name, state="queued", reason=None, owner_uid=0, owner="root", attempts=0, step=None,
                   epoch=None, samples_per_second=None, last_checkpoint_step=None, last_checkpoint_time=None,
                   gpus=[], submitted=1.0, priority=0, restarts_by_reason={}, pids=[])


class Reads:
    def __init__(self, with_ledgers: bool = True) -> None:
        self.at: list[float] = []
        self.with_ledgers = with_ledgers

    def __call__(self, now: float, ledgers: dict[int, Ledger]) -> list[JobView]:
        self.at.append(now)
        if self.with_ledgers:
            ledgers[len(self.at)] = None  # keyed by which read filled it (the ledger itself is not looked at)
        return [view(f"j{len(self.at)}")]


def test_a_scrape_reads_the_views_once_and_its_parts_share_them_at_one_now():
    reads, clock = Reads(), iter([10.0, 20.0, 30.0, 40.0])
    jobs = ScrapeJobs(reads, wall=lambda: next(clock))
    with jobs.scrape():
        gpu_part, job_part = jobs.views(), jobs.views()
        now, ledgers = jobs.live_ledgers()
    assert reads.at == [10.0] and gpu_part is job_part and (now, list(ledgers)) == (10.0, [1])
    with jobs.scrape():
        assert jobs.live_ledgers()[0] == 20.0 and [v.name for v in jobs.views()] == ["j2"]
    jobs.views()
    jobs.views()
    assert reads.at == [10.0, 20.0, 30.0, 40.0] and jobs.reads == 4  # outside a scrape: a read per call


def test_two_scrapes_at_once_each_read_their_own():
    reads = Reads()
    jobs = ScrapeJobs(reads)
    inside, go = threading.Barrier(2, timeout=10), threading.Event()
    seen: dict[str, list[str]] = {}

    def scrape(name: str) -> None:
        with jobs.scrape():
            first = [v.name for v in jobs.views()]
            inside.wait()
            go.wait(10)
            seen[name] = first + [v.name for v in jobs.views()]

    threads = [threading.Thread(target=scrape, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(10)
    assert len(reads.at) == 2 and all(len(set(names)) == 1 for names in seen.values())
    assert {seen["a"][0], seen["b"][0]} == {"j1", "j2"}


def test_one_scrape_of_the_registry_reads_the_jobs_once(tmp_path):
    """The GPU part and the job part both show the jobs, and the host's account their ledgers: one
    read of the views per scrape (each part read them for itself before), for the daemon's
    `ScrapeJobs` and for a plain function of views alike."""
    import json

    from prometheus_client import generate_latest

    from spx.daemon.exporter.server import build_registry
    from spx.daemon.gpu.backend import fake_backend
    from spx.daemon.gpu.fake import DEFAULT_FIXTURE, FakeNvml
    from spx.daemon.gpu.fake_procs import ProcessScanner
    from spx.daemon.state.ledger_view import HostAccount
    from spx.daemon.state.store import Store

    fixture = json.loads(DEFAULT_FIXTURE.read_text())
    for dev in fixture["devices"]:
        dev["xid_schedule"] = []
    nvml = FakeNvml(fixture)
    nvml._procs = ProcessScanner([d["uuid"] for d in fixture["devices"]], proc=tmp_path)
    backend = fake_backend(nvml)
    store = Store(tmp_path / "s.sqlite")
    try:
        reads = Reads(with_ledgers=False)  # queued jobs only: no GPU time
        daemon_like = build_registry(backend, ScrapeJobs(reads), "t", host_account=HostAccount(store, 0.0))
        plain_calls: list[int] = []
        plain = build_registry(backend, lambda: plain_calls.append(1) or [view("p")], "t")
        for n in (1, 2):
            text = generate_latest(daemon_like).decode()
            assert len(reads.at) == n and f'spx_job="j{n}"' in text and "spx_host_gpu_seconds_total" in text
            assert 'spx_job="p"' in generate_latest(plain).decode() and len(plain_calls) == n
    finally:
        store.close()
        backend.close()
