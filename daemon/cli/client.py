"""`spx`'s questions to the daemon: one request over the control socket, its error as a CliError
with the exit status to leave with; and, when no daemon answers, root's read-only look at the store
(`spx ls` and `spx status` still work on a stopped host; a change never goes that way).
"""

from __future__ import annotations

import os
import time

from spx.daemon.cli import queue_cmds
from spx.daemon.cli.socket_hint import not_running_message
from spx.daemon.core.config import DaemonConfig
from spx.daemon.service import control

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_UNCONFIRMED = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_PIPE_CLOSED = 130, 141  # 128 + SIGINT, 128 + SIGPIPE: what a shell reports for those
# The one table of `spx`'s exit statuses: `spx --help` shows it, docs/cli.md repeats it.
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "done (`status`: the job has not failed; `doctor`: no check failed)"),
    (EXIT_FAIL, "refused or failed: no such job (or not yours), not allowed, no daemon answering, the daemon "
                "rejected the job file, `status` of a failed job, a failed `doctor` check, a refused `adopt`"),
    (EXIT_USAGE, "usage: unknown command or option, an invalid job file or command line, a bad value"),
    (EXIT_UNCONFIRMED, "`submit --json/--parsable`: the job file is in the spool but no daemon took it in time "
                       "(no job id yet; it is queued when a daemon runs)"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
    (EXIT_PIPE_CLOSED, "its output was closed early (`spx status NAME | head`): stopped quietly"),
)


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAIL):
        super().__init__(message)
        self.code = code


class NotRunning(CliError):
    """No daemon answered and the store could not stand in for it: a caller that can wait for a
    restarting daemon (`spx logs -f`) tells this from a refusal."""


def ask(cfg: DaemonConfig, op: str, name: str | None = None, arg: str | None = None) -> object:
    """Ask the daemon; if it is not running, root may still read the store directly."""
    try:
        reply = control.request(cfg.socket_path, op, name, arg=arg)
    except TimeoutError as e:  # something listens there but did not answer whole in time
        raise CliError(f"{e}; the daemon may be overloaded (see its log)") from e
    except OSError:
        return _ask_store(cfg, op, name, arg)
    if not reply.get("ok"):
        raise CliError(reply.get("error", "request failed"), reply.get("code", EXIT_FAIL))
    return reply["result"]


def _ask_store(cfg: DaemonConfig, op: str, name: str | None, arg: str | None = None) -> object:
    if op in ("cancel", "gpu-release", "replay-spec", *queue_cmds.COMMANDS, "queue") or not os.access(cfg.store_path, os.R_OK):
        raise NotRunning(not_running_message(cfg))
    if op == "gpus":
        return []  # the GPUs a daemon uses: none while it is not running
    # Imported only on this fallback path: keeps `spx` quick to start.
    from spx.daemon.state import accounting, incident_views, jobviews
    from spx.daemon.state.db import StoreRefused
    from spx.daemon.state.store import Store

    try:
        store = Store(cfg.store_path, readonly=True)
    except StoreRefused as e:  # a store a newer version wrote: say so, not a traceback
        raise CliError(str(e)) from None
    try:
        if op == "accounting":
            return [u.to_json() for u in accounting.usage_since(store, float(arg or 0), time.time())]
        if op == "incidents":  # root's read: every job
            found = incident_views.visible(store, name, lambda _job: True)
            if found is None:
                raise CliError(f"no job named {name!r}")
            return found
        if op in ("ls", "history"):
            return [v.to_json() for v in jobviews.all_views(store, cfg.run_dir, scope="all" if op == "history" else "recent")]
        job = store.jobs.by_name(name or "")
        if job is None:
            raise CliError(f"no job named {name!r}")
        return jobviews.job_view(store, job, cfg.run_dir, with_history=True).to_json(with_history=True)
    finally:
        store.close()
