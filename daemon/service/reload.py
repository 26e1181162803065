"""`systemctl reload`: the daemon becomes the code now installed, in place, keeping its jobs.

SIGHUP makes the loop re-execute the process (same pid) once no job is between phases: the new image's
start adopts the running attempts (its own children still) and sends READY=1. Before that, the
installed code must pass `--check` (it imports the daemon and loads the config): a reload into code
that cannot start is refused and this image runs on.
"""

from __future__ import annotations

import os
import subprocess
import sys

from spx.daemon.lifecycle.record import Phase, TrackedJob

# Phases a re-exec may leave a job in: nothing of it is in flight on the loop's pool or in a stop, so
# the new image's recover() takes it on exactly (an attempt running, a backoff, a wait for GPUs).
REEXEC_SAFE = {Phase.RUNNING, Phase.BACKOFF, Phase.READY, Phase.DONE}


def jobs_between_phases(records: dict[int, TrackedJob]) -> tuple[str, ...]:
    """The jobs a re-exec must wait for ("name: phase"): their attempt is preparing, stopping or
    being diagnosed, or their data staging — work of this image that the next could not take over."""
    return tuple(sorted(f"{s.job.name}: {s.phase.value}" for s in records.values() if s.phase not in REEXEC_SAFE))


def reexec_argv() -> list[str]:
    """This process's command line, to exec again: the entry-point script itself when it was run as
    one (its #! line then names the interpreter of the install now in place), else the interpreter
    with its original arguments (`python -m spx.daemon.service.main ...`)."""
    script = sys.argv[0]
    if os.path.isabs(script) and not script.endswith(".py") and os.access(script, os.X_OK):
        return [script, *sys.argv[1:]]
    return [sys.executable, *sys.orig_argv[1:]]


def check_new_image(argv: list[str]) -> str | None:
    """Run the installed code with `--check`: why a re-exec into it would fail, or None."""
    try:
        r = subprocess.run([*argv, "--check"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=60, close_fds=True)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{argv[0]} --check: {e}"
    if r.returncode != 0:
        return f"{argv[0]} --check exited {r.returncode}: {(r.stderr or r.stdout).strip()[-500:]}"
    return None
