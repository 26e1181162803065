"""The environment contract between the daemon and the workers it launches (docs/job-spec.md, "What the
workers get (the contract)").

Both sides import this module: the daemon to set the variables, `spx.trainer` to read them. It is
stdlib-only on purpose (so is core.bounded, which checks what a heartbeat holds), so the daemon can
use it without ever loading torch. Changing a name here is a protocol change: workers built against
an older library would stop resuming.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from spx.daemon.contract.metrics import metric_json, parse_metric
from spx.daemon.contract.replay_verdict import ReplayVerdict, parse_replay_verdict
from spx.daemon.core import bounded

ENV_JOB = "SPX_JOB"
ENV_ATTEMPT = "SPX_ATTEMPT"
ENV_CHECKPOINT_DIR = "SPX_CHECKPOINT_DIR"
ENV_RESUME_FROM = "SPX_RESUME_FROM"
# A per-job directory on fast host-local storage (RAM under /dev/shm by default): spx.trainer writes
# each checkpoint there first and replicates it to SPX_CHECKPOINT_DIR; the daemon removes it when the job ends.
ENV_LOCAL_CHECKPOINT_DIR = "SPX_LOCAL_CHECKPOINT_DIR"
ENV_HEARTBEAT_FILE = "SPX_HEARTBEAT_FILE"
# A random id per attempt, inherited by every process of it: how the daemon finds an attempt's
# processes in /proc after a restart of its own (pids are reused; job names repeat across roots).
ENV_ATTEMPT_ID = "SPX_ATTEMPT_ID"
# The generation of the job's `.spx/lease` this attempt was launched under (its fencing token):
# spx.trainer publishes a checkpoint only while the lease is still at it (contract/fencing.py). Set
# for one-host jobs; unset for a job across hosts and for a script run by hand.
ENV_FENCE = "SPX_FENCE"
# The job file's `checkpoints.keep`, set only when the file sets it: then it wins over the script's own
# `TrainerConfig(keep=…)` (whoever submits decides how much disk the job holds); unset, the script's
# choice stands.
ENV_CHECKPOINT_KEEP = "SPX_CHECKPOINT_KEEP"
MAX_CHECKPOINT_KEEP = 1000
# Steps whose data a rollback after a divergence skips ("31-37" or "31-37,52-52": ranges of global
# optimizer steps, first-last inclusive). spx.trainer consumes those steps' batches without training
# on them and records the ranges in its checkpoints, so a later resume keeps skipping them.
ENV_SKIP_STEPS = "SPX_SKIP_STEPS"
MAX_SKIP_RANGES = 64
# Set (even to ""), the attempt is a verification replay of the checkpoints in SPX_CHECKPOINT_DIR, which
# it only reads: spx.trainer resumes from the start of the chain of checkpoint records (each checkpoint's
# `replay.json` names the checkpoint its interval began at) that reaches back to step S ("S"; "" or
# "oldest": as far back as the chain goes), trains the same steps again, compares every step's loss and
# gradient norms and each checkpoint's state hash with the records, saves nothing, and ends with a
# "replayed" heartbeat whose `replay` field is the verdict (`ReplayVerdict`), exit status 0 whatever it is.
ENV_REPLAY = "SPX_REPLAY"
ENV_NAMES = (ENV_JOB, ENV_ATTEMPT, ENV_CHECKPOINT_DIR, ENV_RESUME_FROM, ENV_HEARTBEAT_FILE, ENV_ATTEMPT_ID,
             ENV_LOCAL_CHECKPOINT_DIR, ENV_FENCE, ENV_CHECKPOINT_KEEP, ENV_SKIP_STEPS, ENV_REPLAY)

StepRanges = tuple[tuple[int, int], ...]

def checkpoint_keep(env: dict[str, str] | os._Environ[str]) -> int | None:
    """SPX_CHECKPOINT_KEEP as a number of checkpoints (1 to MAX_CHECKPOINT_KEEP), or None when it
    is unset or not such a number (the script's own `keep` then stands)."""
    raw = env.get(ENV_CHECKPOINT_KEEP, "").strip()
    if not raw.isdigit() or len(raw) > 4:
        return None
    keep = int(raw)
    return keep if 1 <= keep <= MAX_CHECKPOINT_KEEP else None


def parse_skip_steps(raw: str) -> StepRanges:
    """SPX_SKIP_STEPS as sorted, merged (first, last) ranges; "" is none. ValueError for anything
    else: a trainer told to skip data it cannot read must not train on that data."""
    ranges = []
    parts = [p for p in raw.replace(" ", "").split(",") if p]
    if len(parts) > MAX_SKIP_RANGES:
        raise ValueError(f"{ENV_SKIP_STEPS}: {len(parts)} ranges, at most {MAX_SKIP_RANGES}")
    for part in parts:
        first, _, last = part.partition("-")
        try:
            lo = bounded.whole_text(first.encode(), ENV_SKIP_STEPS, 1)
            hi = bounded.whole_text((last or first).encode(), ENV_SKIP_STEPS, lo)
        except bounded.Garbage as e:
            raise ValueError(f"{ENV_SKIP_STEPS}: {part!r} is not a range of steps FIRST-LAST ({e.detail})") from None
        ranges.append((lo, hi))
    return merge_step_ranges(ranges)


def merge_step_ranges(ranges: Iterable[Sequence[int]]) -> StepRanges:
    """`ranges` ((first, last) pairs: tuples, or lists as a checkpoint stores them) sorted, with
    overlapping and adjacent ones merged."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted((int(lo), int(hi)) for lo, hi in ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def parse_replay(raw: str) -> int | None:
    """SPX_REPLAY as the step the replay must reach back to (None: "" or "oldest", as far as the chain
    goes). ValueError for anything else: a verification told something it cannot read must not guess."""
    word = raw.strip()
    if word in ("", "oldest"):
        return None
    try:
        return bounded.whole_text(word.encode(), ENV_REPLAY)
    except bounded.Garbage as e:
        raise ValueError(f"{ENV_REPLAY}: {raw[:40]!r} is not a step number, \"\" or \"oldest\" ({e.detail})") from None


def format_skip_steps(ranges: StepRanges) -> str:
    """The SPX_SKIP_STEPS value of `ranges` ("31-37,52-52")."""
    return ",".join(f"{lo}-{hi}" for lo, hi in ranges)


# A worker that checkpointed on SIGTERM exits with this code (EX_TEMPFAIL: "try again later"), and
# says so in its heartbeat, because torchrun reports every non-zero worker exit as its own exit 1.
EXIT_PREEMPTED = 75
# A worker that found its job's lease taken by another host when it went to publish a checkpoint
# (the fence, contract/fencing.py) publishes nothing and exits with this code (EX_NOPERM: it may no
# longer write the job's checkpoints); the job lives on on the host that took it over.
EXIT_FENCED = 77
# A worker whose loss or gradient norm diverged (NaN/Inf, or a spike by the configured rule) writes a
# "diverged" heartbeat saying at which step, which value and by which rule, publishes nothing more and
# exits with this code (EX_DATAERR): the daemon rolls the job back to a checkpoint before that step.
EXIT_DIVERGED = 65

HEARTBEAT_MIN_INTERVAL_SECONDS = 1.0
HEARTBEAT_MAX_BYTES = 64 * 1024  # a beat is a few hundred bytes; the daemon reads no more
MAX_STATUS_CHARS = 64

# When each start-up phase of an attempt ended on the worker (Unix seconds), carried in rank 0's
# heartbeat so `spx status --timeline` shows where a (re)start spends its time. In start-up order:
# the worker's interpreter started, `spx.trainer` finished importing (it imports torch), the
# process group is up (rendezvous), the resume checkpoint is loaded (or none was found), the first
# optimizer step is done. A name not listed here is dropped by the reader.
WORKER_PHASES = ("interpreter_up", "torch_imported", "rendezvous", "checkpoint_loaded", "first_step")

# Each rank's own work per step (spx.trainer: its forward seconds, a mean over the last few steps,
# gathered from every rank), indexed by global rank, so the daemon can name a slow rank and its GPU.
# At most this many ranks (about 10 KiB of a beat); a longer or odd list is dropped, not the beat.
MAX_RANKS_REPORTED = 1024
MAX_RANK_STEP_SECONDS = 86400.0


@dataclass
class Heartbeat:
    """Progress of a running job, written by rank 0 and read by the daemon.

    `step` is the global optimizer step (it never restarts at an epoch boundary); hang detection
    watches it move. `status` is "running", "checkpointing" (a periodic checkpoint is being written:
    a calibrated hang timeout waits for it), "preempted" (checkpointed on SIGTERM, then exited) or
    "finished". Times are Unix seconds, so the daemon can compare them across a restart of its own.
    `phases` maps WORKER_PHASES names to when they ended in this attempt (None: not reported).
    Where the writer is (torch's numbering, docs/multinode.md; None where its env did not say):
    `node_rank` (GROUP_RANK) of `nnodes` (GROUP_WORLD_SIZE), and `ranks`, the node's global ranks
    [first, last] (first: RANK of its local rank 0, the writer; last: first + LOCAL_WORLD_SIZE - 1).
    `rank_step_seconds[r]`: global rank r's own work per step (see MAX_RANKS_REPORTED); empty: timed,
    nothing measured yet (the first window of steps is not over); None: not reported.
    `checkpoint_stall_seconds`: the seconds this attempt's training loop has waited on checkpoint
    saves so far (None: not reported), the goodput ledger's `checkpoint` time.
    `loss` and `grad_norm` are the last step's (any script may report them; the daemon applies the
    NaN/Inf rule to what it reads); `diverged` says why a "diverged" beat is one (`Divergence`).
    `replay` is the verdict of a verification replay (SPX_REPLAY), on its last beat, status "replayed".
    """

    step: int
    epoch: int = 0
    samples_per_second: float = 0.0
    last_checkpoint_step: int | None = None
    last_checkpoint_time: float | None = None
    status: str = "running"
    time: float = field(default_factory=time.time)
    phases: dict[str, float] | None = None
    node_rank: int | None = None
    nnodes: int | None = None
    ranks: list[int] | None = None
    rank_step_seconds: list[float] | None = None
    checkpoint_stall_seconds: float | None = None
    loss: float | None = None
    grad_norm: float | None = None
    diverged: Divergence | None = None
    replay: ReplayVerdict | None = None

    def to_json(self) -> str:
        doc = asdict(self)
        doc["loss"], doc["grad_norm"] = metric_json(self.loss), metric_json(self.grad_norm)
        if self.diverged is not None:
            doc["diverged"]["value"] = metric_json(self.diverged.value)
        if self.replay is not None:
            doc["replay"] = self.replay.to_doc()
        return json.dumps(doc, sort_keys=True)


@dataclass(frozen=True)
class Divergence:
    """What made an attempt's training diverge: at `step`, `metric` ("loss", "grad_norm") was
    `value` (NaN or ±Inf included), which `rule` ("non-finite", "spike: …") calls divergent."""

    step: int
    metric: str
    value: float
    rule: str

    def describe(self) -> str:
        """'loss NaN', 'grad_norm 1.2e+04 (spike: above median 2.1 + 10 x MAD 0.3)'."""
        shown = metric_json(self.value)
        if isinstance(shown, float):
            shown = f"{shown:.4g}"
        return f"{self.metric} {shown}" + ("" if self.rule == NON_FINITE else f" ({self.rule})")


NON_FINITE = "non-finite"
MAX_RULE_CHARS = 200
def _divergence(raw: object, step: int) -> Divergence | None:
    if not isinstance(raw, dict):
        return None
    f = bounded.Fields(raw, "heartbeat", "diverged.")
    try:
        value = parse_metric(raw.get("value"))
        return Divergence(step=f.whole("step", missing=step), metric=f.text("metric", 32),
                          value=math.nan if value is None else value, rule=f.text("rule", MAX_RULE_CHARS))
    except bounded.Garbage:
        return None


def write_heartbeat(path: str | os.PathLike[str], beat: Heartbeat) -> None:
    """Replace the heartbeat file atomically: a reader sees the old or the new JSON, never half."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=".hb-", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(beat.to_json())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_heartbeat(data: str | bytes) -> Heartbeat:
    """The heartbeat in a file's content, or `bounded.Garbage` saying why it is not one: not JSON,
    too large or deep, or fields the daemon cannot compute with — a step that is no whole number
    below 2**53 (a string, 1e400, 10**400) would break hang detection, the metrics or the store.
    Only `phases` is lenient: an odd phase is dropped, never the beat (its step drives hang
    detection)."""
    f = bounded.Fields(bounded.parse_json(data, "heartbeat", max_bytes=HEARTBEAT_MAX_BYTES, mark=True), "heartbeat")
    nnodes = f.whole("nnodes", 1, missing=None)
    node_rank = f.whole("node_rank", 0, nnodes - 1 if nnodes is not None else bounded.MAX_WHOLE, missing=None)
    when = f.real("time", 0.0, bounded.MAX_TIME, missing=None)
    step = f.whole("step")
    return Heartbeat(
        step=step,
        epoch=f.whole("epoch", missing=0),
        samples_per_second=f.real("samples_per_second", 0.0, missing=0.0),
        last_checkpoint_step=f.whole("last_checkpoint_step", missing=None),
        last_checkpoint_time=f.real("last_checkpoint_time", 0.0, bounded.MAX_TIME, missing=None),
        status=f.text("status", MAX_STATUS_CHARS, missing="running"),
        phases=_known_phases(f.doc.get("phases")),
        node_rank=node_rank,
        nnodes=nnodes,
        ranks=_ranks(f),
        rank_step_seconds=_rank_step_seconds(f.doc.get("rank_step_seconds")),
        checkpoint_stall_seconds=_optional_real(f.doc.get("checkpoint_stall_seconds")),
        loss=parse_metric(f.doc.get("loss")),
        grad_norm=parse_metric(f.doc.get("grad_norm")),
        diverged=_divergence(f.doc.get("diverged"), step),
        replay=parse_replay_verdict(f.doc.get("replay")),
        **({"time": when} if when is not None else {}),
    )


def parse_heartbeat(data: str | bytes) -> Heartbeat | None:
    """`load_heartbeat`, None for what is not a heartbeat (the worker's side, and tests)."""
    try:
        return load_heartbeat(data)
    except bounded.Garbage:
        return None


def _known_phases(raw: object) -> dict[str, float] | None:
    """Only WORKER_PHASES names with times in range: odd phases never cost the beat itself (its step
    drives hang detection), they are just not shown."""
    if not isinstance(raw, dict):
        return None
    out = {}
    for name in WORKER_PHASES:
        try:
            out[name] = bounded.real(raw.get(name), "heartbeat", 0.0, bounded.MAX_TIME)
        except bounded.Garbage:
            continue
    return out or None


def _rank_step_seconds(raw: object) -> list[float] | None:
    """Every rank's seconds per step, each in [0, MAX_RANK_STEP_SECONDS], at most MAX_RANKS_REPORTED
    of them (empty: none measured yet); anything else is dropped (None), never the beat (its step
    drives hang detection)."""
    if not isinstance(raw, list) or len(raw) > MAX_RANKS_REPORTED:
        return None
    try:
        return [bounded.real(v, "heartbeat", 0.0, MAX_RANK_STEP_SECONDS, name="rank_step_seconds") for v in raw]
    except bounded.Garbage:
        return None


def _optional_real(raw: object) -> float | None:
    """A lenient seconds field: a number in [0, MAX_TIME], else None."""
    try:
        return None if raw is None else bounded.real(raw, "heartbeat", 0.0, bounded.MAX_TIME)
    except bounded.Garbage:
        return None


def _ranks(f: bounded.Fields) -> list[int] | None:
    """The node's global ranks [first, last]: two whole numbers, 0 <= first <= last."""
    ranks = f.items("ranks", 2, missing=None)
    if ranks is None:
        return None
    if len(ranks) != 2:
        raise bounded.Garbage("heartbeat", f"ranks holds {len(ranks)} numbers, not [first, last]")
    first = bounded.whole(ranks[0], "heartbeat", name="ranks[0]")
    return [first, bounded.whole(ranks[1], "heartbeat", first, name="ranks[1]")]


def read_heartbeat(path: str | os.PathLike[str]) -> Heartbeat | None:
    """The last heartbeat, or None if there is none yet or it does not parse (never raises). The
    worker's side; the root daemon reads through `spx.daemon.userfs.heartbeat` instead."""
    try:
        with open(path, "rb") as f:
            return parse_heartbeat(f.read(HEARTBEAT_MAX_BYTES + 1))
    except OSError:
        return None


def attempt_number() -> int:
    """The daemon's attempt number for this launch (1 when run by hand).

    The example scripts inject their faults (--crash-at-step, --hang-at-step) only in attempt 1, so
    the resumed attempt runs clean.
    """
    try:
        return int(os.environ.get(ENV_ATTEMPT, "1"))
    except ValueError:
        return 1
