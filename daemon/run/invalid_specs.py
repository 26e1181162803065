"""At daemon start: a job whose accepted spec this version refuses ends `failed`, with why.

An upgrade may tighten a bound (a hang timeout once accepted, now past the maximum); the store still
reads such a job (`JobRow.spec_problem` says what this version refuses), but no attempt of it can be
started on values this version does not accept. So before the supervisor takes the store's jobs on,
each live one without an open attempt ends failed with the problem as its reason: the user
resubmits it fixed. One with an open attempt is left to the supervisor, which adopts the attempt as
it is.
"""

from __future__ import annotations

from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store


def fail_invalid_specs(store: Store, now: float) -> list[JobRow]:
    """End every live job without an open attempt whose stored spec is invalid now; returns them."""
    failed = []
    for job in store.jobs.live_with_invalid_spec():
        if store.attempts.open_for(job.id) is None:
            store.jobs.transition(job.id, JobState.FAILED,
                                  f"its accepted spec is not valid in this version ({job.spec_problem}); "
                                  "fix and resubmit it", now, gpus=[])
            failed.append(job)
    return failed
