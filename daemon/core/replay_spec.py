"""The `replay:` part of a job file — this job is a verification replay of another job's checkpoints
(`spx verify NAME` writes it) — and the `verify:` part — replay this job's new checkpoints now and
then, on GPUs nobody uses (docs/verify.md).

A replay runs the other job's command on other GPUs with SPX_REPLAY set: spx.trainer then resumes
from the oldest checkpoint of the chain asked for, trains the same steps again, compares every step's
numbers bitwise with what the checkpoints recorded, saves nothing, and says the verdict in its last
heartbeat. It reads the other job's checkpoint dir, so its own `checkpoints.dir` must be that dir and
its `checkpoints.resume` must not be `never` (which would set that job's checkpoints aside).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"


class Replay(BaseModel):
    """Which job's checkpoints to verify, and from which step on."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    of: str = Field(pattern=NAME_PATTERN, description=(
        "The job whose checkpoints are replayed: the owner's latest job of that name. Its verdict rolls that "
        "job back when it differs."))
    from_step: int | None = Field(None, ge=0, le=2**53, description=(
        "Verify the checkpoint intervals from this step on; default: from the oldest checkpoint kept."))


class Verify(BaseModel):
    """Replay the job's newest checkpoint intervals every `every_checkpoints` checkpoints, when as many
    GPUs as it has are idle (run/auto_verify.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    every_checkpoints: int = Field(ge=1, le=10_000, description=(
        "A replay of the intervals since the last one after this many new checkpoints, on idle GPUs only."))
