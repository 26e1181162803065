"""Zero-config checkpoint discovery: which checkpoint a relaunch resumes from, for scripts that save
their own way, and why the newer ones were passed over.

    discover(ckpt_dir, pattern=None, exclude={}) -> Discovery

The names in `ckpt_dir` say the layout; each layout has its own completeness rule
(checkpoint_formats):

| layout      | candidates                                   | complete when                                   |
|-------------|----------------------------------------------|-------------------------------------------------|
| spx         | `step-NNNNNNNNN/`                            | COMPLETE.json matches the files                 |
| epoch-step  | `checkpoint_epoch{e}_step{s}.pt`             | torch.save zip directory reads, has data.pkl    |
| nanogpt     | `ckpt.pt`                                    | the same                                        |
| hf-trainer  | `checkpoint-N/`                              | trainer_state.json parses and the weights are whole |
| deepspeed   | `global_stepN/` (tag dirs) + `latest`        | not newer than `latest`; model states whole     |
| lightning   | `last.ckpt`, `epoch=E-step=S*.ckpt`          | torch.save zip directory reads, has data.pkl    |
| dcp         | any other dir with `*.distcp` / `.metadata`  | `.metadata` (written last) is there             |

`checkpoints.pattern` (a glob) replaces the table for layouts it does not know: a match named like
a known layout gets that layout's rule, any other directory the rule its content shows (or: not
empty, no partial files, every torch/safetensors file whole), any other file its format's.

Candidates are ordered newest first by the step in their names ((epoch, step) for epoch-step);
one without a number (`ckpt.pt`, `last.ckpt`) ranks just above the newest numbered one it is not
older than (by mtime). The first complete one not in `exclude` is chosen; the incomplete ones met
before it are reported with their reasons, and a few older complete ones are kept (the crash-loop
fallback resumes from the next one). Hostile dirs are bounded: at most MAX_SCAN entries are read
and MAX_EVALUATED candidates judged, and the answer says when a cap cut the scan.

Runs as the job's owner (userfs.user_actions); stdlib (and core.bounded) only, never torch.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spx.daemon.contract import checkpoint_formats as fmt
from spx.daemon.contract.checkpoint_layout import TMP_MARK
from spx.daemon.core import bounded

MAX_SCAN = 10_000          # entries of the checkpoint dir read (a hostile dir may hold millions)
MAX_EVALUATED = 64         # candidates judged, newest first
MAX_PROBED_DIRS = 256      # unnamed directories looked into for torch.distributed.checkpoint files
KEEP_OLDER = 3             # older complete candidates kept for the fallback
MAX_REPORTED_SKIPS = 20    # skipped candidates in the answer (the rest are counted)

_SPX = re.compile(r"^step-(\d{9})$")
_EPOCH_STEP = re.compile(r"^checkpoint_epoch(\d+)_step(\d+)\.pt$")
_HF = re.compile(r"^checkpoint-(\d+)$")
_DS_TAG = re.compile(r"^global_step(\d+)$")
_LIGHTNING = re.compile(r"^epoch=(\d+)-step=(\d+)(?:[-_].*)?\.ckpt$")
_LIGHTNING_LAST = re.compile(r"^last(?:-v\d+)?\.ckpt$")
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class Candidate:
    """One thing in the dir that looks like a checkpoint. `order` ranks candidates (newest last);
    `problem` is None when it is complete, else why it is not."""

    name: str
    path: Path
    layout: str
    step: int | None
    order: tuple[int, ...]
    mtime: float
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "path": str(self.path), "layout": self.layout, "step": self.step}
        if self.problem is not None:
            out["why"] = self.problem
        return out


@dataclass(frozen=True)
class Discovery:
    """What discovery found: the checkpoint to resume from (None: start fresh), the older complete
    ones, the candidates passed over and why, and whether a cap cut the scan short."""

    chosen: Candidate | None
    older: list[Candidate] = field(default_factory=list)
    skipped: list[Candidate] = field(default_factory=list)
    layouts: list[str] = field(default_factory=list)
    capped: str | None = None
    excluded: Candidate | None = None   # the would-be choice `exclude` passed over

    @property
    def layout(self) -> str | None:
        """The layout recognised: the chosen checkpoint's, else the newest candidate's."""
        if self.chosen is not None:
            return self.chosen.layout
        return self.skipped[0].layout if self.skipped else (self.layouts[0] if self.layouts else None)

    def to_json(self) -> dict[str, Any]:
        """The capped answer userfs sends back (a hostile dir cannot make it large)."""
        return {
            "path": str(self.chosen.path) if self.chosen else None,
            "step": self.chosen.step if self.chosen else None,
            "layout": self.layout,
            "layouts": self.layouts[:8],
            "older": [c.to_json() for c in self.older[:KEEP_OLDER]],
            "skipped": [c.to_json() for c in self.skipped[:MAX_REPORTED_SKIPS]],
            "skipped_more": max(0, len(self.skipped) - MAX_REPORTED_SKIPS),
            "capped": self.capped,
            "excluded": self.excluded.to_json() if self.excluded else None,
        }


def _classify(name: str, kind: str) -> tuple[str, tuple[int, ...]] | None:
    """(layout, numbers from the name) for a name some known layout writes, else None."""
    if kind == "dir":
        for layout, rx in (("spx", _SPX), ("hf-trainer", _HF), ("deepspeed", _DS_TAG)):
            if m := rx.match(name):
                return layout, (int(m.group(1)),)
        return None
    if m := _EPOCH_STEP.match(name):
        return "epoch-step", (int(m.group(1)), int(m.group(2)))
    if m := _LIGHTNING.match(name):
        return "lightning", (int(m.group(1)), int(m.group(2)))
    if name == "ckpt.pt":
        return "nanogpt", ()
    if _LIGHTNING_LAST.match(name):
        return "lightning", ()
    return None


_RULES: dict[str, Callable[[Path], str | None]] = {
    "spx": fmt.spx_problem,
    "epoch-step": fmt.torch_zip_problem,
    "nanogpt": fmt.torch_zip_problem,
    "lightning": fmt.torch_zip_problem,
    "hf-trainer": fmt.hf_trainer_problem,
    "deepspeed": fmt.deepspeed_tag_problem,
    "dcp": fmt.dcp_problem,
    "pattern-dir": fmt.generic_dir_problem,
    "pattern-file": fmt.generic_file_problem,
}


@dataclass
class _Scan:
    """Raw candidates before ordering: (name, path, layout, numbers, mtime, pre-judged problem)."""

    rows: list[tuple[str, Path, str, tuple[int, ...], float, str | None]] = field(default_factory=list)
    capped: str | None = None
    latest_tag: str | None = None
    latest_missing: str | None = None


def _mtime(path: Path) -> float:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0


def _scan_zero_config(ckpt_dir: Path) -> _Scan:
    scan = _Scan()
    try:
        it = os.scandir(ckpt_dir)
    except OSError:
        return scan
    with it:
        entries = list(itertools.islice(it, MAX_SCAN + 1))
    if len(entries) > MAX_SCAN:
        scan.capped = f"the scan stopped after {MAX_SCAN} entries of {ckpt_dir}; later ones were not looked at"
        entries = entries[:MAX_SCAN]
    names = {e.name for e in entries}
    if "latest" in names:
        scan.latest_tag = fmt.read_latest_tag(ckpt_dir)
    probes = 0  # directories of no named layout looked into for DCP's files
    for e in entries:
        if e.name.startswith("."):
            continue  # hidden: staging, set-aside dirs (`.before-job-ID`), editors' files
        path = Path(e.path)
        kind = fmt.kind(path)
        if kind is None:
            for probe in ("dir", "file"):
                if (c := _classify(e.name, probe)) is not None:
                    scan.rows.append((e.name, path, c[0], c[1], _mtime(path), fmt.not_followed(path)))
                    break
            continue
        c = _classify(e.name, kind)
        if c is None and kind == "dir" and e.name == scan.latest_tag:
            c = ("deepspeed", tuple(int(n) for n in _DIGITS.findall(e.name))[-1:])
        if c is None and kind == "dir" and probes < MAX_PROBED_DIRS:
            probes += 1
            if fmt.looks_like_dcp(path):
                c = ("dcp", tuple(int(n) for n in _DIGITS.findall(e.name))[-1:])
        if c is not None:
            scan.rows.append((e.name, path, c[0], c[1], _mtime(path), None))
    if scan.latest_tag is not None and scan.latest_tag not in names:
        scan.latest_missing = scan.latest_tag
    return scan


def _scan_pattern(ckpt_dir: Path, pattern: str) -> _Scan:
    scan = _Scan()
    matches = list(itertools.islice(ckpt_dir.glob(pattern.rstrip("/")), MAX_SCAN + 1))
    if len(matches) > MAX_SCAN:
        scan.capped = f"the pattern {pattern!r} matched more than {MAX_SCAN} entries; later ones were not looked at"
        matches = matches[:MAX_SCAN]
    for path in matches:
        name = str(path.relative_to(ckpt_dir))
        kind = fmt.kind(path)
        numbers = tuple(int(n) for n in _DIGITS.findall(path.name))
        if kind is None:
            scan.rows.append((name, path, "pattern", numbers, _mtime(path), fmt.not_followed(path)))
            continue
        c = _classify(path.name, kind)
        layout, numbers = c if c is not None else (f"pattern-{kind}", numbers)
        if TMP_MARK in path.name or path.name.endswith(fmt.PARTIAL_SUFFIXES):
            scan.rows.append((name, path, layout, numbers, _mtime(path), "a staging directory (not yet published)"))
            continue
        scan.rows.append((name, path, layout, numbers, _mtime(path), None))
    return scan


def _order(rows: list[tuple[str, Path, str, tuple[int, ...], float, str | None]]) -> list[Candidate]:
    """Newest first. Numbered candidates by their numbers; one without a number ranks just above
    the newest numbered candidate it is not older than."""
    numbered = sorted((nums, mtime) for _, _, _, nums, mtime, _ in rows if nums)
    out = []
    for name, path, layout, nums, mtime, problem in rows:
        if nums:
            order = (*nums, 0)
            # A number past 2**53 in a name is no step any run reached: it still orders the
            # candidate, but is not reported (the daemon stores steps; SQLite's integers end at 2**63).
            step: int | None = nums[-1] if nums[-1] <= bounded.MAX_WHOLE else None
        else:
            below = [n for n, m in numbered if m <= mtime]
            order = (*(below[-1] if below else (-1,)), 1)
            step = None
        out.append(Candidate(name, path, layout, step, order, mtime, problem))
    # Name last: equal orders (two layouts at one step) resolve the same way every time.
    return sorted(out, key=lambda c: (c.order, c.mtime, c.name), reverse=True)


def discover(ckpt_dir: Path, pattern: str | None = None, exclude: Mapping[str, str] | None = None,
             before_step: int | None = None) -> Discovery:
    """The checkpoint to resume from in `ckpt_dir` (see the module docstring). `exclude` maps
    paths that must not be chosen to the reason (a checkpoint the job crash-looped on). With
    `before_step` (a divergence rollback), only a checkpoint of a known step below it is chosen;
    none is: start from scratch."""
    exclude = exclude or {}
    scan = _scan_pattern(ckpt_dir, pattern) if pattern else _scan_zero_config(ckpt_dir)
    ordered = _order(scan.rows)
    layouts = list(dict.fromkeys(c.layout for c in ordered))
    chosen: Candidate | None = None
    older: list[Candidate] = []
    skipped: list[Candidate] = []
    passed_over: Candidate | None = None
    if scan.latest_missing is not None:
        skipped.append(Candidate("latest", ckpt_dir / "latest", "deepspeed", None, (), 0.0,
                                 f"names {scan.latest_missing}, which is not there"))
    capped = scan.capped
    latest_order = next((c.order for c in ordered if c.layout == "deepspeed" and c.name == scan.latest_tag), None)
    for i, c in enumerate(ordered):
        if i >= MAX_EVALUATED:
            capped = capped or f"only the newest {MAX_EVALUATED} of {len(ordered)} candidates were judged"
            break
        problem = c.problem
        if problem is None and chosen is None and str(c.path) in exclude:
            # Only what would be chosen is passed over: a newer complete checkpoint supersedes it.
            problem = exclude[str(c.path)]
            passed_over = c
        if problem is None and before_step is not None and (c.step is None or c.step >= before_step):
            problem = (f"its step is unknown: not shown to precede step {before_step}, where training diverged"
                       if c.step is None else f"at or after step {before_step}, where training diverged")
        if problem is None and c.layout == "deepspeed" and not pattern:
            if scan.latest_tag is None:
                problem = "no `latest` tag file beside it (DeepSpeed writes it last)"
            elif latest_order is not None and c.order > latest_order:
                problem = f"newer than the `latest` tag ({scan.latest_tag}): DeepSpeed writes `latest` last"
        if problem is None:
            problem = _RULES[c.layout](c.path) if c.layout in _RULES else None
        if problem is not None and problem.startswith(f"{c.path.name}: "):
            problem = problem[len(c.path.name) + 2:]  # the file's own rule names it; the candidate does already
        judged = Candidate(c.name, c.path, c.layout, c.step, c.order, c.mtime, problem)
        if problem is not None:
            skipped.append(judged)
        elif chosen is None:
            chosen = judged
        else:
            older.append(judged)
            if len(older) >= KEEP_OLDER:
                break
    if chosen is None and passed_over is not None:
        # Nothing older to fall back to: starting from scratch would throw the run away; resume it.
        skipped = [c for c in skipped if c.path != passed_over.path]
        chosen, passed_over = passed_over, None
    return Discovery(chosen, older, skipped, layouts, capped, passed_over)


def describe(doc: dict[str, Any]) -> list[str]:
    """Discovery's stored answer (`Discovery.to_json`, plus `fallback_from` when the crash-loop
    fallback passed over the newest, `rollback` when a divergence or a replay rolled the job back,
    `set_aside` the checkpoints a replay found wrong) in the lines the attempt log and `spx status` show."""
    lines = []
    if isinstance(doc.get("rollback"), str):
        lines.append(doc["rollback"])
    aside = doc.get("set_aside")
    if isinstance(aside, list) and aside:
        names = [os.path.basename(str(p)) for p in aside]
        lines.append(f"set aside (a replay differed): {', '.join(names[:4])}"
                     + (f" and {len(names) - 4} more" if len(names) > 4 else "")
                     + f", into {os.path.dirname(str(aside[0]))}/")
    layout = doc.get("layout")
    chosen = doc.get("path")
    if chosen:
        step = doc.get("step")
        lines.append(f"resumed from {chosen}" + (f" (step {step})" if step is not None else "")
                     + (f", layout {layout}" if layout else ""))
    else:
        lines.append("no complete checkpoint; started fresh" + (f" (layout {layout})" if layout else ""))
    if doc.get("fallback_from"):
        lines.append(f"fell back from {doc['fallback_from']}: {doc.get('fallback_why') or 'crash loop'}")
    for s in doc.get("skipped") or []:
        if not isinstance(s, dict) or s.get("path") == doc.get("fallback_from"):
            continue
        lines.append(f"skipped {s.get('name')} ({s.get('layout')}): {s.get('why')}")
    if doc.get("skipped_more"):
        lines.append(f"… and {doc['skipped_more']} more skipped")
    if doc.get("capped"):
        lines.append(f"note: {doc['capped']}")
    return lines
