"""The names of an attempt's (re)start phases, in order, and their stored form (run/timeline.py says
what each one means and who records it).

A leaf of the state layer (stdlib and the torch-free contract only), so the job views, the CLI and
the recorder share one list.
"""

from __future__ import annotations

import json
import math

from spx.daemon.contract.worker_env import WORKER_PHASES

FAILURE_PHASES = ("worker_exit", "launcher_exit", "failure_seen", "group_dead", "end_recorded")
START_PHASES = ("placed", "joined", "checkpoint_found", "spawn")  # joined: across hosts only
# Names a phase had before: read as the name it has now (a store written by an earlier version).
_RENAMED = {"gpus_free": "placed"}
ATTEMPT_PHASES = (*START_PHASES, *WORKER_PHASES, "first_beat")
ALL_PHASES = (*FAILURE_PHASES, *ATTEMPT_PHASES)


def stored(raw: str | None) -> dict[str, float]:
    """An attempt row's `phases` column as a dict (known names, finite times); {} if none or odd."""
    try:
        doc = json.loads(raw or "{}")
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    doc = {_RENAMED.get(k, k): v for k, v in doc.items()}
    return {k: float(doc[k]) for k in ALL_PHASES
            if isinstance(doc.get(k), (int, float)) and not isinstance(doc.get(k), bool) and math.isfinite(doc[k])}
