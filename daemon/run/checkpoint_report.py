"""Say what checkpoint discovery decided for an attempt: in the daemon's log (with job and attempt)
and in the attempt's own log, where the user reads why a relaunch resumed where it did."""

from __future__ import annotations

from typing import Any

from spx.daemon.contract.checkpoint_discovery import describe
from spx.daemon.contract.checkpoint_layout import CheckpointRef
from spx.daemon.core.log import get_logger
from spx.daemon.run import attempt_files
from spx.daemon.run.attempt_files import AttemptFiles

log = get_logger()


def say(job: str, attempt: int, files: AttemptFiles, ref: CheckpointRef | None, found: dict[str, Any]) -> None:
    """Log the discovery (`checkpoint_discovered`, and `resume_fallback` when a crash loop made it
    pass over the newest checkpoint) and note skipped candidates in the attempt log. Never raises."""
    skipped = [f"{s.get('name')}: {s.get('why')}" for s in found.get("skipped") or [] if isinstance(s, dict)]
    log.info("checkpoint_discovered", job=job, attempt=attempt, layout=found.get("layout"),
             path=str(ref.path) if ref else None, step=ref.step if ref else None, skipped=skipped[:5],
             capped=found.get("capped"))
    if found.get("fallback_from"):
        log.warning("resume_fallback", job=job, attempt=attempt, passed_over=found["fallback_from"],
                    why=found.get("fallback_why"), resume_from=str(ref.path) if ref else None)
    if skipped or found.get("fallback_from") or found.get("capped"):
        attempt_files.note(files, "checkpoint discovery: " + "\n".join(describe(found)))
