"""What an `after:` name means, the Slurm way (`sbatch --dependency=afterok:ID` refuses an unknown
job at submission rather than waiting for one that may never come).

A name means the latest job of that name submitted before this one that the submitter can see (their
own; root and the admin group: anyone's). At intake a name with no such job rejects the file (the
`.error` next to it says which name), so a typo never leaves a job waiting forever. Because a job can
only name jobs submitted before it, dependency cycles cannot be built. Resolution is by job id, so a
later job reusing the name does not change what an earlier job waits for.
"""

from __future__ import annotations

from spx.daemon.core.spec import JobSpec
from spx.daemon.core.users import is_admin
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.store import Store

_EVERY_JOB = 1 << 62  # at intake the new job has no id yet: every job recorded so far came before it


def resolve_dep(store: Store, name: str, before_id: int, uid: int, admin_group: str | None) -> JobRow | None:
    """The job `after: [name]` means for owner `uid` (see the module doc), or None."""
    return store.jobs.latest_named_before(name, before_id, None if is_admin(uid, admin_group) else uid)


def dependency_problem(store: Store, spec: JobSpec, uid: int, admin_group: str | None) -> str | None:
    """At intake: the first `after:` name that names no job the submitter can see, said with the fix."""
    for name in spec.after:
        if resolve_dep(store, name, _EVERY_JOB, uid, admin_group) is None:
            return (f"after: no job named {name!r} that you can see was submitted before this one (spx ls --all "
                    "lists them); submit it first, or remove it from `after`")
    return None
