"""Fair lanes for the work the daemon does on users' behalf, off the main loop.

Why: whatever the daemon does for a user that can wait on something the user controls — a helper
process run as the user in their tree, a pipe to the user's process, a read of a file on their volume —
must neither stall the main loop nor hold up another user's work. A user can make any of those wait
(SIGSTOP their own helper, hold `flock` on their own lock file, drop 10,000 spool files), so a pool
shared first-come-first-served lets one user's stalls become everyone's.

So every task belongs to an owner (a uid), and:
- at most `per_owner` tasks of one owner run at once, at most `total` tasks run at all;
- the next free slot goes to the owner whose turn it is (round robin over owners with work waiting),
  never to whoever queued most;
- each task's deadline counts from when it *started*, never from when it was queued: a task past its
  deadline is answered `overdue` at once, so its caller goes on. Its thread still holds its owner's
  slot until it really returns (the work itself is bounded by its own timeout: a helper process is
  killed at its deadline), so a stuck task costs its own owner a slot, never another owner one.

Answers come back on the caller's thread: `deliver()` (called by the main loop every turn) runs each
finished task's `on_done` there, so completions may touch the loop's own objects; one that raises
is logged and the others still run.
"""

from __future__ import annotations

import itertools
import threading
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spx.daemon.core.log import get_logger

log = get_logger()


@dataclass(frozen=True)
class Outcome:
    """How a task ended: its `value`, the exception it raised (`error`), or `overdue` (it had run past
    its deadline when it was answered; `error` then says how long)."""

    value: Any = None
    error: BaseException | None = None
    overdue: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.overdue


class Overdue(TimeoutError):
    """The error of an overdue outcome: the task ran past its deadline (counted from its start)."""


@dataclass(eq=False)
class Task:
    owner: int
    kind: str                               # what it is, for logs and `counts()` ("discovery", "intake", …)
    work: Callable[[], Any]
    deadline: float                         # seconds from its start
    on_done: Callable[[Outcome], None]
    number: int
    queued: float
    started: float | None = None
    answered: bool = False                  # on_done has been (or is about to be) run: never twice
    result: Outcome | None = field(default=None, repr=False)


class Lanes:
    """The daemon's one pool of off-loop work, fair by owner (see the module doc)."""

    def __init__(self, total: int, per_owner: int, wake: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic, name: str = "spx-lane"):
        if total < 1 or per_owner < 1:
            raise ValueError("lanes need at least one slot in all and one per owner")
        self.total = total
        self.per_owner = per_owner
        self._wake = wake
        self._clock = clock
        self._name = name
        self._lock = threading.Condition()
        self._waiting: OrderedDict[int, deque[Task]] = OrderedDict()  # owner → queued tasks, owners in turn order
        self._running: dict[int, set[Task]] = {}                       # owner → tasks holding a slot
        self._finished: deque[Task] = deque()
        self._threads: list[threading.Thread] = []
        self._idle_threads = 0
        self._numbers = itertools.count(1)
        self._closed = False

    # --- the loop's side ------------------------------------------------------------------------

    def submit(self, owner: int, kind: str, work: Callable[[], Any], deadline: float,
               on_done: Callable[[Outcome], None]) -> Task:
        """Queue `work` in `owner`'s lane; `on_done(outcome)` runs later, in `deliver()`."""
        with self._lock:
            if self._closed:
                raise RuntimeError("lanes are closed")
            task = Task(owner, kind, work, deadline, on_done, next(self._numbers), self._clock())
            self._waiting.setdefault(owner, deque()).append(task)
            if self._idle_threads == 0 and len(self._threads) < self.total:
                self._start_thread()
            self._lock.notify()
        return task

    def cancel(self, task: Task) -> bool:
        """Drop a task that has not started (its on_done never runs); False once it runs or ran."""
        with self._lock:
            queue = self._waiting.get(task.owner)
            if queue is None or task not in queue:
                return False
            queue.remove(task)
            if not queue:
                del self._waiting[task.owner]
            task.answered = True
            return True

    def deliver(self) -> int:
        """Run `on_done` of every task that finished, and answer `overdue` to every running task past
        its deadline. On the caller's thread (the main loop). Returns how many were answered."""
        now = self._clock()
        answers: list[tuple[Task, Outcome]] = []
        with self._lock:
            while self._finished:
                task = self._finished.popleft()
                if not task.answered:
                    task.answered = True
                    answers.append((task, task.result or Outcome()))
            for tasks in self._running.values():
                for task in tasks:
                    if not task.answered and task.started is not None and now - task.started > task.deadline:
                        task.answered = True
                        late = Overdue(f"{task.kind} did not finish in {task.deadline:g} s")
                        answers.append((task, Outcome(error=late, overdue=True)))
        for task, outcome in answers:
            try:
                task.on_done(outcome)
            except Exception as e:  # noqa: BLE001 — one answer's bug must not lose the others
                log.error("lane_answer_failed", job=None, attempt=None, kind=task.kind, owner=task.owner,
                          error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=8))
        return len(answers)

    def counts(self) -> dict[int, tuple[int, int]]:
        """owner → (running, queued): what each owner's lane holds now (metrics, `spx status`)."""
        with self._lock:
            owners = set(self._running) | set(self._waiting)
            return {o: (len(self._running.get(o, ())), len(self._waiting.get(o, ()))) for o in owners}

    def close(self, wait: float = 0.0) -> None:
        """No new task; queued ones are dropped unanswered; running ones finish on their own. With
        `wait`, up to that many seconds for the threads to end."""
        with self._lock:
            self._closed = True
            for queue in self._waiting.values():
                for task in queue:
                    task.answered = True
            self._waiting.clear()
            self._lock.notify_all()
        deadline = time.monotonic() + wait
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()) if wait else 0)

    # --- the workers' side ----------------------------------------------------------------------

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._serve, name=f"{self._name}-{len(self._threads) + 1}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _next(self) -> Task | None:
        """The first owner in turn order with work waiting and a free slot gives its oldest task; that
        owner then goes to the back of the order. Called with the lock held."""
        if sum(len(t) for t in self._running.values()) >= self.total:
            return None
        for owner, queue in self._waiting.items():
            if len(self._running.get(owner, ())) < self.per_owner:
                task = queue.popleft()
                del self._waiting[owner]
                if queue:
                    self._waiting[owner] = queue  # back of the order
                task.started = self._clock()
                self._running.setdefault(owner, set()).add(task)
                return task
        return None

    def _serve(self) -> None:
        while True:
            with self._lock:
                task = self._next()
                while task is None:
                    if self._closed:
                        self._threads.remove(threading.current_thread())
                        return
                    self._idle_threads += 1
                    self._lock.wait()
                    self._idle_threads -= 1
                    task = self._next()
            try:
                outcome = Outcome(value=task.work())
            except BaseException as e:  # noqa: BLE001 — every failure is an answer, never lost
                outcome = Outcome(error=e)
            with self._lock:
                running = self._running[task.owner]
                running.discard(task)
                if not running:
                    del self._running[task.owner]
                task.result = outcome
                self._finished.append(task)
                self._lock.notify_all()  # a slot is free: another owner's task may start
            self._wake()
