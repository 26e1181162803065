"""The `restart` part of a job spec: how many relaunches, the backoff between them, when a job that
stopped advancing is hung, which exit codes are retried, and a rule per failure class
(`restart.on_failure`) merged over the defaults. The decisions made with it are lifecycle/policy.py's.

Every number is finite and bounded (hang timeout <= 30 days, backoff <= 1 day): a timer of 1e308 s
would overflow the deadlines computed from it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from spx.daemon.core.causes import FAILURE_CLASSES, ReasonClass

MAX_HANG_TIMEOUT = 30 * 24 * 3600.0
MAX_BACKOFF = 24 * 3600.0


class _Strict(BaseModel):
    # As every part of the job file's model (spec.py, nodes.py): unknown keys and `.inf`/`.nan` are errors.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# The failure classes a job's own attempt can end with (core.causes.FAILURE_CLASSES), which
# `restart.on_failure` sets a rule for. Not there: lost, launch, cancelled and daemon restarts, which
# are never the job's fault and always resume.
CLASS_RULES = ("always", "never", "counted")


class ClassLimit(_Strict):
    """At most `max` restarts for failures of this class; with `within_first_seconds`, only failures
    that came that soon after their attempt started count (a later one is `counted`). Class
    divergence only: with `rollback`, each restart resumes from the newest complete checkpoint before
    the divergent step and skips the data since it (SPX_SKIP_STEPS); `args` are added to the script's
    arguments of every attempt after the job's first divergence (e.g. a lower learning rate)."""

    max: int = Field(ge=0, le=1_000_000, description="Restarts allowed for this class (earlier attempts of the job that ended with it).")
    within_first_seconds: float | None = Field(
        None, gt=0, le=MAX_HANG_TIMEOUT,
        description="Only failures this soon after the attempt started are limited; later ones fall under max_restarts.")
    rollback: bool = Field(
        False, description="divergence only: relaunch from the newest complete checkpoint before the divergent step, "
                           "skipping the data of the steps since it.")
    args: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list, max_length=256,
        description="divergence only: arguments added to the script's for every attempt after the job's first "
                    "divergence (e.g. [--lr, '1e-4']).")


def _rule_kind(v: object) -> str:
    return "limit" if isinstance(v, dict | ClassLimit) else "word"


# Discriminated, so a bad {max: …} is reported against ClassLimit only (not also as "not a word").
ClassRule = Annotated[
    Annotated[Literal["always", "never", "counted"], Tag("word")] | Annotated[ClassLimit, Tag("limit")],
    Discriminator(_rule_kind),
]
# A user-code exception raised in the first 2 minutes of an attempt is a bug that a relaunch
# replays: restarted once (a transient cause gets a second chance), then the job fails. Preemption
# and a GPU fault are not the job's doing (a GPU fault is relaunched on healthy GPUs): always
# restarted, not counted. An OOM may be a fragmentation one-off, three tries. A divergence (a NaN or
# spiking loss) is rolled back to the checkpoint before it, skipping the data since, three times.
DEFAULT_ON_FAILURE: dict[str, ClassRule] = {
    ReasonClass.DIVERGENCE.value: ClassLimit(max=3, rollback=True),
    ReasonClass.USER_CODE.value: ClassLimit(max=1, within_first_seconds=120.0),
    ReasonClass.OOM.value: ClassLimit(max=3),
    ReasonClass.PREEMPTED.value: "always",
    ReasonClass.GPU_FAULT.value: "always",
}


class Restart(_Strict):
    max_restarts: int = Field(10, ge=0, le=1_000_000, description="Relaunches allowed before the job fails.")
    backoff_seconds: tuple[float, float] = Field(
        (10.0, 300.0), description="[first, cap] of the exponential backoff between attempts; cap at most one day."
    )
    hang_timeout_seconds: float | None = Field(
        None, gt=0, le=MAX_HANG_TIMEOUT,
        description="No heartbeat step progress this long = hang (at most 30 days). Unset: calibrated from the "
                    "job's own step intervals — max(10 s, 5 × their p99, 2 × the longest), 900 s until 5 were seen.",
    )
    on_exit_codes: Literal["any"] | list[Annotated[int, Field(ge=0, le=255)]] = Field(
        "any", description="Exit codes (0-255) that are restarted; any other non-zero code fails the job."
    )
    on_failure: dict[str, ClassRule] = Field(
        default_factory=lambda: dict(DEFAULT_ON_FAILURE),
        description="A rule per failure class (" + ", ".join(FAILURE_CLASSES) + "): `always` (restarted, not "
        "counted against max_restarts), `never` (the job fails), `counted` (restarted while max_restarts allows) or "
        "{max: N, within_first_seconds: S}; merged over the defaults.",
    )
    standby_workers: bool = Field(
        False, description="torchrun only: the next attempt's workers are started ahead too, each with torch, "
        "torch._dynamo and spx.trainer imported, and a relaunch hands them their ranks (docs/recovery.md). Costs "
        "a worker's imports in host RAM per local rank for the whole run. A script that changes the environment "
        "before its `import torch` is started cold instead; not for one that sets, after `import torch`, what "
        "torch._dynamo reads when its first optimizer step imports it.",
    )

    @field_validator("on_failure", mode="before")
    @classmethod
    def _known_classes(cls, v: object) -> object:
        if not isinstance(v, dict):
            raise ValueError("must be a mapping of failure class to a rule, e.g. {user-code: {max: 1}, preempted: always}")
        for key, rule in v.items():
            if key not in FAILURE_CLASSES:
                raise ValueError(f"unknown failure class {key!r}; the classes are: {', '.join(FAILURE_CLASSES)}")
            if isinstance(rule, str) and rule not in CLASS_RULES:
                raise ValueError(f"{key}: unknown rule {rule!r}; a rule is always, never, counted or {{max: N, "
                                 "within_first_seconds: S}")
            if not isinstance(rule, str | dict | ClassLimit):
                raise ValueError(f"{key}: a rule is always, never, counted or {{max: N, within_first_seconds: S}}")
            if key != ReasonClass.DIVERGENCE and isinstance(rule, dict | ClassLimit) and any(
                    (rule.get(k) if isinstance(rule, dict) else getattr(rule, k)) for k in ("rollback", "args")):
                raise ValueError(f"{key}: rollback and args apply to the divergence class only")
        return {**DEFAULT_ON_FAILURE, **v}

    @field_validator("backoff_seconds")
    @classmethod
    def _ordered(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not 0 <= v[0] <= v[1] <= MAX_BACKOFF:
            raise ValueError(f"must be [first, cap] with 0 <= first <= cap <= {MAX_BACKOFF:.0f} (one day)")
        return v
