"""Which copy of a checkpoint to resume from when there are two tiers: the job's host-local dir
(SPX_LOCAL_CHECKPOINT_DIR, RAM) and the persistent one (SPX_CHECKPOINT_DIR).

spx.trainer writes each checkpoint locally first and replicates it to the persistent dir in the
background, manifest last, so each tier holds complete checkpoints by the same torch-free rule
(`checkpoint_layout.read_manifest`). The rule here: prefer the local copy when it is complete and
its step is at least the persistent copy's (it loads from RAM, and it may be newer: the replica of
the latest step can still be in flight when a rank dies); else the persistent copy. After a host
loss the local dir is gone (a new host, or RAM cleared), so the persistent copy is chosen by the
same rule. A torn local copy (no manifest, or files of the wrong size) never counts.

Shared by the daemon (SPX_RESUME_FROM, through userfs as the job's owner) and the trainer (its own
resume when SPX_RESUME_FROM is unset). Stdlib only, never torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spx.daemon.contract import checkpoint_layout
from spx.daemon.contract.checkpoint_discovery import Discovery, discover

LOCAL = "local"
PERSISTENT = "persistent"


@dataclass(frozen=True)
class TierChoice:
    """The copy to resume from (None: neither tier holds a complete checkpoint) and its tier."""

    ref: checkpoint_layout.CheckpointRef | None
    tier: str | None


def prefer(local_step: int | None, persistent_step: int | None) -> str | None:
    """The tier to load from given each tier's latest complete step (None: none there)."""
    if local_step is not None and (persistent_step is None or local_step >= persistent_step):
        return LOCAL
    return PERSISTENT if persistent_step is not None else None


def latest_complete(persistent_dir: Path, local_dir: Path | None) -> TierChoice:
    """The spx layout's latest complete checkpoint over both tiers, by `prefer`."""
    persistent = checkpoint_layout.latest_complete(persistent_dir)
    local = checkpoint_layout.latest_complete(local_dir) if local_dir is not None else None
    tier = prefer(local.step if local else None, persistent.step if persistent else None)
    return TierChoice(local if tier == LOCAL else persistent if tier == PERSISTENT else None, tier)


def discover_tiers(persistent_dir: Path, local_dir: Path | None, pattern: str | None = None,
                   exclude: dict[str, str] | None = None, before_step: int | None = None) -> tuple[Discovery, str | None]:
    """`checkpoint_discovery.discover` in each tier, and the answer of the tier `prefer` picks
    (the persistent one's when neither has a complete checkpoint: its skips explain why). Only
    the spx layout has a local tier; a `pattern` job's checkpoints are the persistent dir's.
    `before_step`: a divergence rollback's (`discover`), in both tiers."""
    if local_dir is not None and exclude:
        # A checkpoint excluded in one tier (the crash-loop fallback) is excluded in both: its
        # replica holds the same state.
        exclude = {**{str(d / Path(k).name): v for k, v in exclude.items()
                      for d in (persistent_dir, local_dir) if Path(k).parent in (persistent_dir, local_dir)},
                   **exclude}
    persistent = discover(persistent_dir, pattern, exclude, before_step)
    if local_dir is None or pattern:
        return persistent, PERSISTENT if persistent.chosen else None
    local = discover(local_dir, None, exclude, before_step)
    local_step = local.chosen.step if local.chosen and local.chosen.layout == "spx" else None
    persistent_step = persistent.chosen.step if persistent.chosen else None
    if persistent.chosen is not None and persistent_step is None:
        return persistent, PERSISTENT  # a numberless checkpoint cannot be compared: the persistent one rules
    tier = prefer(local_step, persistent_step)
    return (local if tier == LOCAL else persistent), tier
