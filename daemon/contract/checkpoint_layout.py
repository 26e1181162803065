"""The on-disk checkpoint layout: the contract between the daemon and the trainer (docs/trainer.md).

A checkpoint is a directory `step-000001200/` whose payload is written first and whose manifest
`COMPLETE.json` is written last, inside a temporary directory that is renamed into place. A directory
counts as a checkpoint only if its manifest parses and every file it lists exists with the listed
size; that check is all the daemon needs to pick `SPX_RESUME_FROM`, and it needs no torch.

Scripts that keep their own naming (`checkpoint_epoch{e}_step{s}.pt` (epoch-step), nanoGPT's `ckpt.pt`,
Hugging Face's `checkpoint-*/`, …) are found by `checkpoint_discovery`. This module is stdlib-only
(with core.bounded, its JSON reader) and only names and reads; the writer side (publish, retention —
renames and deletes in the user's tree) is the trainer's, `spx.trainer.layout_writer`, run in
workers as the job's user.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from spx.daemon.core import bounded

MANIFEST = "COMPLETE.json"
MANIFEST_MAX_BYTES = 32 << 20  # a line per file of the checkpoint
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d{9})$")
TMP_MARK = ".tmp-"


@dataclass(frozen=True)
class CheckpointRef:
    """A complete checkpoint: where it is and the global step it holds (None for pattern matches
    whose name carries no number)."""

    path: Path
    step: int | None


def step_dirname(step: int) -> str:
    """The one name of the checkpoint of global step `step`; zero-padded so names sort by step."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"step-{step:09d}"


def step_of_dirname(name: str) -> int | None:
    """The step a checkpoint's name holds (`step_dirname`'s inverse); None for any other name."""
    m = _STEP_DIR.match(name)
    return int(m.group(1)) if m else None


def tmp_dirname(step: int, token: str) -> str:
    """The staging directory a checkpoint is written into before it is published.

    `token` must be the same on every rank of one save (e.g. rank 0's pid, broadcast at start-up).
    Staging directories are never mistaken for checkpoints and are swept by `remove_stale_tmp`.
    """
    return f"{step_dirname(step)}{TMP_MARK}{token}"


def file_digest(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 of a file, read in 1 MiB chunks (checkpoint shards are large)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(ckpt: Path) -> dict | None:
    """The manifest of `ckpt` if it parses and every listed file has its listed size, else None.

    Checksums are not recomputed here (the daemon must answer in milliseconds on multi-GB
    checkpoints); `verify_checksums` does that when asked.
    """
    try:
        with open(ckpt / MANIFEST, "rb") as f:
            manifest = bounded.parse_json(f.read(MANIFEST_MAX_BYTES + 1), MANIFEST, max_bytes=MANIFEST_MAX_BYTES)
        if int(manifest["step"]) < 0:
            return None
        for entry in manifest["files"]:
            rel = Path(entry["path"])
            if rel.is_absolute() or ".." in rel.parts:
                return None
            if (ckpt / rel).stat().st_size != int(entry["size"]):
                return None
        return manifest
    except (OSError, ValueError, KeyError, TypeError):
        return None


def verify_checksums(ckpt: Path) -> bool:
    """Full check: sizes and sha256 of every listed file."""
    manifest = read_manifest(ckpt)
    if manifest is None:
        return False
    return all(
        "sha256" not in e or file_digest(ckpt / e["path"]) == e["sha256"] for e in manifest["files"]
    )


def complete_checkpoints(ckpt_dir: Path) -> list[CheckpointRef]:
    """Every complete `step-*` checkpoint in `ckpt_dir`, oldest first."""
    found = []
    try:
        entries = list(os.scandir(ckpt_dir))
    except OSError:
        return []
    for entry in entries:
        m = _STEP_DIR.match(entry.name)
        if m and entry.is_dir(follow_symlinks=False) and read_manifest(Path(entry.path)) is not None:
            found.append(CheckpointRef(Path(entry.path), int(m.group(1))))
    return sorted(found, key=lambda r: r.step or 0)


def latest_complete(ckpt_dir: Path) -> CheckpointRef | None:
    """The highest-step complete checkpoint, or None. Incomplete or staging dirs never count."""
    found = complete_checkpoints(ckpt_dir)
    return found[-1] if found else None


def find_latest(ckpt_dir: Path, pattern: str | None = None) -> CheckpointRef | None:
    """What the daemon passes as SPX_RESUME_FROM: the newest complete checkpoint of any layout
    `checkpoint_discovery` recognises, or of the job's `checkpoints.pattern`."""
    from spx.daemon.contract.checkpoint_discovery import discover  # it builds on this module's rules

    found = discover(ckpt_dir, pattern).chosen
    return None if found is None else CheckpointRef(found.path, found.step)
