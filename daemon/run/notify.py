"""Notifications: a job's owner is told when it fails, succeeds, restarts or is cancelled (`notify:`
in the job file, else the daemon config's; docs/notify.md).

The loop's side, one stage per turn: it reads the `events` rows written since its last turn (the
store's history: every state change leaves one, so nothing the machine decides is missed and no
other part of the daemon calls in here), picks the ones a job's `notify` wants, and hands each send
to the owner's lane — lanes of its own (core.lanes, SLOTS_PER_OWNER per owner, SLOTS_TOTAL in
all), not the daemon's: a user's hooks hanging to their deadline never hold the slots their own
jobs' launches and checkpoint discovery need, nor another owner's; the loop never waits. A send that failed is retried after RETRY_BACKOFF_SECONDS[n], at most len(…) more
times, then dropped with a log line; a failing hook is never fatal to the job or the daemon.

Bounded: at most MAX_PENDING_PER_OWNER sends of one owner are waiting or running at once (past it,
new ones are dropped and counted, so a crash-looping job cannot queue without end), the body's text
fields are cut to MAX_FIELD_CHARS, and the deadline of each call is the spec's timeout_seconds
(≤ 60 s). Events written while no daemon ran are not sent (the cursor starts at the newest event).

A failure's body carries its incident (run/incidents.py, at most 64 KiB): the incident is written a
moment after the event (its reads are off the loop), so the event waits for it, asked again each
turn, at most INCIDENT_WAIT_SECONDS; then it is sent with `incident: null`.
"""

from __future__ import annotations

import functools
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spx.daemon.core.causes import NOT_FAILURES
from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.lanes import Lanes, Outcome
from spx.daemon.core.log import get_logger
from spx.daemon.core.notify_spec import Notify
from spx.daemon.run import notify_send
from spx.daemon.run.incident import for_notification
from spx.daemon.run.incidents import READ_DEADLINE_SECONDS
from spx.daemon.state.housekeeping_table import Event
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.store import Store
from spx.daemon.userfs import as_user

log = get_logger()

# The event row's kind (the job's new state) → the name `notify.events` uses.
EVENT_NAMES = {"failed": "failed", "succeeded": "succeeded", "cancelled": "cancelled", "restarting": "restarted"}
EVENTS_PER_TURN = 500
MAX_PENDING_PER_OWNER = 20
MAX_FIELD_CHARS = 2000
RETRY_BACKOFF_SECONDS = (5.0, 30.0, 120.0)
SLOTS_PER_OWNER = 1
SLOTS_TOTAL = 8
# A failure's incident is written a moment after its event (its kernel and log reads are off the
# loop): its notification waits for it this long at most, then goes without (`incident: null`).
INCIDENT_WAIT_SECONDS = READ_DEADLINE_SECONDS + 5.0
MAX_AWAITING = 1000  # events waiting for their incident; past it, one is sent without waiting


@dataclass
class Send:
    """One notification of one event, by one way (webhook or command)."""

    owner: int
    way: str                       # "webhook" | "command"
    job: str
    body: dict[str, Any]
    notify: Notify
    tries: int = 0
    due: float = 0.0


def body_of(event: str, job: JobRow, attempts: int, reason_class: str | None, root_cause: str | None,
            cfg: DaemonConfig) -> dict[str, Any]:
    """The JSON a webhook receives and a command reads on stdin."""
    def cut(text: str | None) -> str | None:
        return None if text is None else text[:MAX_FIELD_CHARS]

    return {
        "event": event, "job": job.name, "job_id": job.id, "job_uid": job.uid, "owner": job.owner,
        "state": job.state.value, "reason": cut(job.reason), "class": reason_class, "attempts": attempts,
        "root_cause": cut(root_cause), "host": socket.gethostname(), "incident": None,
        "links": {"logs": str(cfg.log_dir / job.name), "status": f"spx status {job.name}",
                  "metrics": f"http://{cfg.metrics_address}/metrics"},
    }


def notify_of(job: JobRow, default: Notify | None) -> Notify | None:
    """The job file's `notify`, else the config's (a job's `notify: {}` opts out of the default). A
    stored spec this version refuses (`spec_problem`) is not trusted for it: the config's applies."""
    own = job.spec.notify if job.spec_problem is None else None
    return own if own is not None else default


class Notifications:
    """The main loop's side (see the module doc); `tick` is its stage of each turn."""

    def __init__(self, cfg: DaemonConfig, store: Store, wake: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic, lanes: Lanes | None = None,
                 wall: Callable[[], float] = time.time):
        self.cfg = cfg
        self.store = store
        self.lanes = lanes or Lanes(SLOTS_TOTAL, SLOTS_PER_OWNER, wake=wake, clock=clock, name="spx-notify")
        self.clock = clock
        self.wall = wall  # an event's time is wall time: how long it has waited for its incident
        self._cursor = store.housekeeping.last_event_id()
        self._awaiting: list[tuple[Event, int]] = []  # failures (event, attempt) whose incident is not written yet
        self._retries: list[Send] = []
        self._pending: Counter[int] = Counter()   # owner → sends waiting (retry) or in a lane
        # What /metrics shows, since the daemon started: sends by result (ok, failed, dropped).
        self.results: Counter[str] = Counter()

    def tick(self) -> None:
        self.lanes.deliver()
        now = self.clock()
        due = [s for s in self._retries if s.due <= now]
        if due:
            self._retries = [s for s in self._retries if s.due > now]
            for send in due:
                self._start(send)
        awaiting, self._awaiting = self._awaiting, []
        for event, number in awaiting:
            self._on_event(event, number)
        for event in self.store.housekeeping.events_after(self._cursor, EVENTS_PER_TURN):
            self._cursor = event.id
            self._on_event(event)

    def _on_event(self, event: Event, attempt: int | None = None) -> None:
        """`attempt`: the attempt an event that waited for its incident is about (a later one may
        have started since)."""
        name = EVENT_NAMES.get(event.kind)
        if name is None or event.job_id is None:
            return
        job = self.store.jobs.get(event.job_id)
        notify = notify_of(job, self.cfg.notify)
        if notify is None or not notify.wants(name):
            return
        attempts = self.store.attempts.for_job(job.id)
        if attempt is not None:
            attempts = [a for a in attempts if a.number <= attempt]
        last = attempts[-1] if attempts else None
        body = body_of(name, job, len(attempts), last.reason_class if last else None,
                       last.root_cause if last else None, self.cfg)
        if last is not None and last.reason_class is not None and last.reason_class not in NOT_FAILURES:
            found = self.store.incidents.get(job.id, last.number)
            waited = self.wall() - event.time
            if found is None and waited < INCIDENT_WAIT_SECONDS and len(self._awaiting) < MAX_AWAITING:
                self._awaiting.append((event, last.number))  # asked again next turn
                return
            body["incident"] = for_notification(job.name, last.number, last.reason_class, found.doc) if found else None
        if name == "restarted":
            body["reason"] = (event.detail or "")[:MAX_FIELD_CHARS] or None
        for way in ("webhook", "command"):
            if getattr(notify, way) is None:
                continue
            if self._pending[job.owner_uid] >= MAX_PENDING_PER_OWNER:
                self.results["dropped"] += 1
                log.warning("notify_dropped", job=job.name, attempt=len(attempts) or None, on=name, way=way,
                            why=f"{MAX_PENDING_PER_OWNER} notifications of this owner are already waiting")
                continue
            self._pending[job.owner_uid] += 1
            self._start(Send(job.owner_uid, way, job.name, body, notify))

    def _start(self, send: Send) -> None:
        send.tries += 1
        deadline = send.notify.timeout_seconds + notify_send.REAP_SECONDS + 1.0
        self.lanes.submit(send.owner, f"notify-{send.way}", functools.partial(_deliver, send), deadline,
                          self._answered(send))

    def _answered(self, send: Send) -> Callable[[Outcome], None]:
        def done(outcome: Outcome) -> None:
            fields = {"job": send.job, "attempt": send.body.get("attempts") or None, "on": send.body["event"],
                      "way": send.way, "try": send.tries}
            if outcome.ok:
                self._settled(send.owner)
                self.results["ok"] += 1
                log.info("notify_sent", **fields, answer=outcome.value)
                return
            error = f"{type(outcome.error).__name__}: {outcome.error}"
            if send.tries <= len(RETRY_BACKOFF_SECONDS):
                send.due = self.clock() + RETRY_BACKOFF_SECONDS[send.tries - 1]
                self._retries.append(send)
                log.warning("notify_failed", **fields, error=error,
                            then=f"retried in {RETRY_BACKOFF_SECONDS[send.tries - 1]:g} s")
                return
            self._settled(send.owner)
            self.results["failed"] += 1
            log.warning("notify_failed", **fields, error=error, then="given up")
        return done

    def _settled(self, owner: int) -> None:
        """One of `owner`'s sends is done for good (sent or given up)."""
        self._pending[owner] -= 1
        if self._pending[owner] <= 0:
            del self._pending[owner]

    def close(self) -> None:
        """The daemon stops or re-executes: hooks still running are killed (sends not yet made are lost)."""
        self.lanes.close()
        killed = notify_send.kill_running()
        if killed or self._retries:
            log.info("notify_closed", job=None, attempt=None, hooks_killed=killed, retries_dropped=len(self._retries))

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        return [("spx_notify_sends_total", {"result": r}, float(self.results[r])) for r in ("ok", "failed", "dropped")]


def _deliver(send: Send) -> str:
    """In the owner's lane: one try of one way."""
    owner = as_user.owner(send.owner)
    timeout = send.notify.timeout_seconds
    if send.way == "webhook":
        assert send.notify.webhook is not None
        return notify_send.post_webhook(owner, send.notify.webhook, send.body, timeout)
    argv = send.notify.argv
    assert argv is not None
    return notify_send.run_command(owner, argv, send.body, timeout)
