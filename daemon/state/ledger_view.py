"""A job's goodput ledger from its store rows: gathers the facts `goodput.account` needs (the job's
allocation and end events, each attempt's timeline, progress record, resume step, end and backoff)
and asks it. Every reader (`spx status --json`, /metrics) gets the ledger through here."""

from __future__ import annotations

import threading
import weakref

from spx.daemon.state import attempt_progress, goodput
from spx.daemon.state import phases as timeline
from spx.daemon.state.attempts_table import AttemptRow
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store


def facts(store: Store, job: JobRow, attempts: list[AttemptRow]) -> goodput.JobFacts:
    allocated, placed, ended = store.jobs.allocated_and_ended(job.id)
    if job.state.terminal and ended is None:  # no terminal event (never written so): its last record
        ended = max([job.submitted, *(a.end for a in attempts if a.end is not None)])
    return goodput.JobFacts(
        submitted=job.submitted, gpus=job.spec.gpu_count, allocated=allocated, placed=placed,
        ended=ended if job.state.terminal else None, staged=job.spec.data.stage is not None,
        succeeded=job.state is JobState.SUCCEEDED,
        attempts=tuple(goodput.AttemptFacts(
            start=a.start, end=a.end, phases=timeline.stored(a.phases), progress=attempt_progress.stored(a.progress),
            resumed_from_step=a.resumed_from_step, reason_class=a.reason_class, stop_cause=a.stop_cause,
            backoff=a.backoff, exited=a.exited,
        ) for a in attempts),
    )


# An ended job's ledger, once accounted, per store: it no longer changes (its rows are final; the
# ledger stops at its end), and every `spx ls`, `spx status` and scrape shows the jobs that ended in
# the last day — hundreds of ledgers recomputed per read on a busy host (bench/bench_scale.py). Job
# ids are never reused in a store. Bounded to the newest ENDED_KEPT, the scrape's ended jobs
# (metrics_ended_jobs, 256 by default): each is ~1.8 KiB (measured with tracemalloc over 1,024)
# held for the daemon's life, and at 1,024 the soak (bench/bench_soak.py) was still filling the cache
# half an hour into a life, read as growth; a day of more jobs than this in `spx ls` accounts the
# older ones again on each call.
ENDED_KEPT = 256
_ended: weakref.WeakKeyDictionary[Store, dict[int, goodput.Ledger]] = weakref.WeakKeyDictionary()
_ended_lock = threading.Lock()


def job_ledger(store: Store, job: JobRow, attempts: list[AttemptRow], now: float) -> goodput.Ledger:
    """The job's ledger at `now` (its end if it ended: then accounted once per store and kept)."""
    if not job.state.terminal:
        return goodput.account(facts(store, job, attempts), now)
    with _ended_lock:
        kept = _ended.setdefault(store, {})
        found = kept.get(job.id)
    if found is None:
        found = goodput.account(facts(store, job, attempts), now)
        with _ended_lock:
            kept[job.id] = found
            while len(kept) > ENDED_KEPT:
                del kept[next(iter(kept))]
    return found


class HostAccount:
    """The host's GPU-seconds by cause since `since` (the daemon's start): /metrics asks on every
    scrape, from its own thread. A job that ended is accounted once, into a running sum (its ledger no
    longer changes), and only the jobs that ended since the last read are read: the account's memory
    and each read's cost stay flat however many jobs the daemon has seen end (the soak found a dict
    of every ended job's ledger, read back by id on every scrape, growing for the daemon's life).
    Live ones are accounted afresh. A GPU released from quarantine keeps the quarantined time it had
    (its span ends at the first scrape that sees it released), so no cause goes down."""

    def __init__(self, store: Store, since: float):
        self.store = store
        self.since = since
        self._ended = goodput.HostSeconds(dict.fromkeys(goodput.HOST_CAUSES, 0.0), 0.0)  # GPU-seconds of ended jobs
        self._read_until = since                            # ended jobs changed before this are in `_ended`
        self._read_at: set[int] = set()                     # … and those changed exactly at it
        self._quarantined: dict[int, float] = {}           # GPU → since, as last seen
        self._released: list[tuple[float, float]] = []     # (since, until) of quarantines since ended

    def gpu_seconds(self, gpus: int, now: float, live: dict[int, goodput.Ledger] | None = None) -> goodput.HostSeconds:
        """`live`: the live jobs' ledgers at `now` as a reader already computed them (job id →
        ledger; a scrape's job views), else read here. One that ended since counts once, ended."""
        ended = [(job_id, at) for job_id, at in self.store.jobs.ended_times_since(self._read_until)
                 if not (at == self._read_until and job_id in self._read_at)]
        if ended:
            fresh = [job_ledger(self.store, self.store.jobs.get(job_id), self.store.attempts.for_job(job_id), now)
                     for job_id, _at in ended]
            self._ended = _add(self._ended, goodput.host_account(fresh, 0, (), self.since, now))
            latest = max(at for _id, at in ended)
            self._read_at = {job_id for job_id, at in ended if at == latest} | (
                self._read_at if latest == self._read_until else set())
            self._read_until = latest
        if live is None:
            live_ledgers = [job_ledger(self.store, job, self.store.attempts.for_job(job.id), now)
                            for job in self.store.jobs.live()]
        else:
            gone = {job_id for job_id, _at in ended}
            live_ledgers = [ledger for job_id, ledger in live.items() if job_id not in gone]
        quarantined = {gpu: since for gpu, (_uuid, _reason, since) in self.store.host.quarantined_gpus().items()}
        for gpu, since in self._quarantined.items():
            if quarantined.get(gpu) != since:
                self._released.append((since, now))
        self._quarantined = quarantined
        spans = [*self._released, *((since, None) for since in quarantined.values())]
        jobs = goodput.host_account(live_ledgers, 0, (), self.since, now)
        return goodput.host_account([], gpus, spans, self.since, now, held=_add(self._ended, jobs))


def _add(a: goodput.HostSeconds, b: goodput.HostSeconds) -> goodput.HostSeconds:
    return goodput.HostSeconds({c: a.settled[c] + b.settled[c] for c in a.settled}, a.unsettled + b.unsettled)
