"""What a job's owner must be able to do for the job to run, checked as the owner: the kernel
decides, for a process with their uid, gid and supplementary groups (`userfs.as_user`), never root
guessing from mode bits.

Intake refuses a job on the first problem (accept.py); `spx submit --check` runs the same checks as
the invoking user — who is the owner of what they submit — and lists every problem.
"""

from __future__ import annotations

from pathlib import Path

from spx.daemon.core.spec import JobSpec, root_made
from spx.daemon.userfs import as_user
from spx.daemon.userfs.fsafe import UserPathError

# The checks as the owner run in the owner's lane: one that outlives this (a hung mount in the user's
# tree, a helper the user stopped) rejects the job; the lane answers it overdue a little later.
ACCESS_CHECK_TIMEOUT_SECONDS = 5.0


def access_checks(checkpoints_root: Path, spec: JobSpec, user: as_user.Owner) -> list[tuple[str, str, str]]:
    """(field, path, what) for each thing the job needs of its owner: enter the workdir, read the
    script (and DeepSpeed config) there, read the staging source, write (or create) the staging
    target and the checkpoint dir. An existing checkpoint dir must be theirs, root's jobs included
    (else a reused job name would resume from another user's checkpoints); below checkpoints_root,
    the daemon makes `OWNER` (or a one-component dir) for them, and an existing one must be theirs too."""
    ckpt_dir = spec.checkpoint_dir(checkpoints_root)
    checks: list[tuple[str, str, str]] = [
        ("checkpoints.dir", str(ckpt_dir), "owned"),
        ("workdir", str(spec.workdir or user.home), "enter-dir"),
    ]
    below_root = root_made(checkpoints_root, ckpt_dir, user.name, user.uid)
    if below_root is not None and below_root != ckpt_dir:
        checks.append(("checkpoints.dir", str(below_root), "owned"))
    workdir = spec.workdir or Path(user.home)
    if spec.script:  # relative to the workdir, as the launch runs it
        checks.append(("script", str(workdir / spec.script), "read-file"))
    if spec.deepspeed_config:
        checks.append(("deepspeed_config", str(workdir / spec.deepspeed_config), "read-file"))
    if below_root is None:
        checks.append(("checkpoints.dir", str(ckpt_dir), "write-or-create"))
    if spec.data.stage is not None:
        checks.append(("data.stage.from", str(spec.data.stage.source), "read-tree"))
        checks.append(("data.stage.to", str(spec.data.stage.to), "write-or-create"))
    return checks


def access_problems(checkpoints_root: Path, spec: JobSpec, uid: int,
                    timeout: float = ACCESS_CHECK_TIMEOUT_SECONDS) -> list[str]:
    """Every check the owner `uid` fails, each as "field: why (checked as NAME)"; empty when none."""
    try:
        user = as_user.owner(uid)
    except UserPathError as e:
        return [e.strerror or str(e)]
    checks = access_checks(checkpoints_root, spec, user)
    try:
        problems = as_user.check_access(user, [(path, what) for _f, path, what in checks], timeout)
    except UserPathError as e:
        return [f"cannot check access as {user.name}: {e.strerror}"]
    return [f"{field}: {problem} (checked as {user.name})"
            for (field, _path, _what), problem in zip(checks, problems, strict=True) if problem]


def access_problem(checkpoints_root: Path, spec: JobSpec, uid: int) -> str | None:
    """The first of `access_problems`, or None: what intake rejects a job with."""
    problems = access_problems(checkpoints_root, spec, uid)
    return problems[0] if problems else None
