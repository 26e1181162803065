"""The job spec: one YAML file = one job (docs/job-spec.md).

Parsing is defensive because the daemon runs as root and the file comes from a user. Contract:
`parse_spec` returns a JobSpec or raises SpecError, for every input text, and every number in a
returned JobSpec is finite and bounded (timers included: hang timeout <= 30 days, backoff <= 1 day).
The YAML is read into plain data by `spec_yaml` (no tags beyond the core ones, no aliases, no deep
nesting); unknown keys are errors (a typo must not be silently ignored), and every error names the
field and its line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from spx.daemon.core.nodes import Nodes, multi_node_problem
from spx.daemon.core.notify_spec import Notify
from spx.daemon.core.replay_spec import Replay, Verify
from spx.daemon.core.restart_spec import Restart
from spx.daemon.core.spec_yaml import SpecError, line_of, read_yaml

MAX_SPEC_BYTES = 64 * 1024
MAX_PROBLEMS = 20  # listed in a rejection; finding each one's line is a walk of the document
MAX_AFTER = 64  # dependencies of one job
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
# Variables the daemon owns; a job setting them would break supervision or GPU isolation.
RESERVED_ENV = re.compile(r"^(SPX_.*|CUDA_VISIBLE_DEVICES|CUDA_DEVICE_ORDER|MASTER_ADDR|MASTER_PORT|RANK|WORLD_SIZE|LOCAL_RANK|NVIDIA_VISIBLE_DEVICES)$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names pydantic puts in an error's path for the branch of a union; not fields, so not shown.
_UNION_BRANCHES = {"int", "list[int]", "literal['any']", "list[constrained-int]", "word", "limit", "str", "list[str]"}


class _Strict(BaseModel):
    # allow_inf_nan=False: `.inf`/`.nan` (or "inf" as text) in any float field is an error naming it.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _absolute(p: Path) -> Path:
    if not p.is_absolute():
        raise ValueError("must be an absolute path")
    if ".." in p.parts:
        raise ValueError("must not contain '..'")
    return p


AbsPath = Annotated[Path, Field(description="An absolute path without '..'.")]


class Checkpoints(_Strict):
    dir: AbsPath | None = Field(None, description="Where this job's checkpoints live; default CHECKPOINTS_ROOT/OWNER/NAME.")
    keep: int | None = Field(
        None, ge=1, le=1000, description="Complete checkpoints kept by spx.trainer (SPX_CHECKPOINT_KEEP): older ones "
        "are deleted after a newer one is published; unset, the script's own TrainerConfig(keep) stands (default 3). "
        "A script that saves its own way keeps what it keeps."
    )
    pattern: str | None = Field(
        None, description="Glob for scripts with their own naming (`ckpt.pt`, `checkpoint-*/`); default: the step-*/ layout."
    )

    resume: Literal["auto", "never", "require"] = Field(
        "auto", description="auto: resume from the newest complete checkpoint in dir, whoever wrote it; never: "
        "set aside (into dir/.before-job-ID) what was there before this job was submitted, then resume only from "
        "its own; require: fail at start if dir holds no complete checkpoint."
    )

    _abs = field_validator("dir")(lambda v: v if v is None else _absolute(v))

    @field_validator("pattern")
    @classmethod
    def _relative_glob(cls, v: str | None) -> str | None:
        if v is not None and (v.startswith("/") or ".." in Path(v).parts or not v.strip()):
            raise ValueError("must be a glob relative to checkpoints.dir, without '..'")
        return v


class Stop(_Strict):
    grace_seconds: float = Field(120.0, ge=0, le=3600, description="SIGTERM → checkpoint → exit, before SIGKILL.")


class Stage(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    source: AbsPath = Field(alias="from", description="Persistent copy of the data (e.g. a network volume).")
    to: AbsPath = Field(description="Local disk (NVMe) the job reads from.")

    _abs = field_validator("source", "to")(lambda v: _absolute(v))


class Data(_Strict):
    stage: Stage | None = None


class JobSpec(_Strict):
    """A validated job. Field descriptions are the reference in docs/job-spec.md."""

    name: str = Field(description="[a-z0-9][a-z0-9-_.]{0,62}; unique among live jobs.")
    launcher: Literal["torchrun", "deepspeed", "python"] = "torchrun"
    script: str | None = Field(None, description="Script to run (relative to workdir or absolute).")
    module: str | None = Field(None, description="Or a module to run with -m.")
    args: list[str] = Field(default_factory=list, description="Arguments; {resume_from} and {checkpoint_dir} are expanded.")
    workdir: AbsPath | None = Field(None, description="Working directory; default the owner's home.")
    python: AbsPath | None = Field(None, description="Interpreter of the job's environment; default the daemon's.")
    gpus: int | list[int] = Field(0, description="Count, or an explicit list of GPU indices; 0 = CPU job.")
    procs: int | None = Field(None, ge=1, le=512, description="Worker processes; default the number of GPUs (1 if none).")
    deepspeed_config: str | None = Field(None, description="DeepSpeed JSON config (launcher: deepspeed only).")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for the workers.")
    nodes: Nodes = Field(default_factory=lambda: Nodes(), description="Hosts the job spans (nodes.py).")
    checkpoints: Checkpoints = Field(default_factory=lambda: Checkpoints())
    resume_args: list[str] = Field(default_factory=list, description="Appended only when resuming.")
    restart: Restart = Field(default_factory=lambda: Restart())
    stop: Stop = Field(default_factory=lambda: Stop())
    data: Data = Field(default_factory=lambda: Data())
    priority: int = Field(0, ge=-1000, le=1000, description="Higher runs first; FIFO within a priority.")
    after: list[str] = Field(default_factory=list, max_length=MAX_AFTER, description=(
        "Names of jobs this one waits for: it starts once each has succeeded, and fails if one failed or was "
        "cancelled. A name means the latest job of that name submitted before this one that the submitter "
        "can see (their own; root and the admin group: anyone's); none is an intake error."))
    replay: Replay | None = Field(None, description=(
        "This job replays another job's checkpoint intervals to verify them ({of: NAME, from_step: S}); "
        "`spx verify NAME` writes it (replay_spec.py, docs/verify.md)."))
    verify: Verify | None = Field(None, description=(
        "Replay the job's new checkpoint intervals on idle GPUs every N checkpoints ({every_checkpoints: N}); "
        "a difference rolls the job back (docs/verify.md)."))
    notify: Notify | None = Field(None, description=(
        "Who is told of the job's end or restarts: {webhook: URL, command: ARGV, events: [failed, succeeded, "
        "restarted, cancelled]} (notify_spec.py, docs/notify.md); unset: the daemon config's `notify`, if any."))

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(
                "must match [a-z0-9][a-z0-9-_.]{0,62} (lower-case letters, digits, '-', '_', '.'; "
                "no '/' and at most 63 characters)"
            )
        return v

    @field_validator("after")
    @classmethod
    def _after(cls, v: list[str]) -> list[str]:
        for dep in v:
            if not NAME_RE.match(dep):
                raise ValueError(f"{dep!r} is not a job name ([a-z0-9][a-z0-9-_.]{{0,62}})")
        if len(set(v)) != len(v):
            raise ValueError("names a job twice")
        return v

    _abs = field_validator("workdir", "python")(lambda v: v if v is None else _absolute(v))

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: int | list[int]) -> int | list[int]:
        if isinstance(v, int) and not 0 <= v <= 64:
            raise ValueError("must be a count between 0 and 64, or a list of GPU indices")
        if isinstance(v, list) and (not v or len(set(v)) != len(v) or min(v) < 0 or max(v) > 63):
            raise ValueError("an explicit list must be non-empty, without duplicates, of indices 0-63")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not ENV_KEY_RE.match(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if RESERVED_ENV.match(key):
                raise ValueError(f"{key} is set by the daemon and cannot be overridden")
        return v

    @model_validator(mode="after")
    def _cross_field(self) -> JobSpec:
        if (self.script is None) == (self.module is None):
            raise ValueError("give exactly one of `script` or `module`")
        if self.launcher == "deepspeed" and not self.deepspeed_config:
            raise ValueError("launcher: deepspeed needs `deepspeed_config: FILE`")
        if self.launcher != "deepspeed" and self.deepspeed_config:
            raise ValueError("`deepspeed_config` is only used with launcher: deepspeed")
        if self.launcher == "deepspeed" and self.gpu_count and self.procs and self.procs != self.gpu_count:
            raise ValueError("launcher: deepspeed runs one worker per GPU; drop `procs` or make it equal to gpus")
        if self.launcher == "deepspeed" and self.module:
            raise ValueError("launcher: deepspeed runs a `script`, not a `module`")
        if self.restart.standby_workers and self.launcher != "torchrun":
            raise ValueError("restart.standby_workers: only torchrun's workers can be started ahead")
        if self.launcher == "python" and self.worker_count > 1:
            raise ValueError("launcher: python runs one process; use torchrun for procs > 1")
        if self.replay is not None and (self.checkpoints.dir is None or self.checkpoints.resume == "never"):
            raise ValueError("`replay` reads the checkpoints of the job it verifies: give that job's dir as "
                             "`checkpoints.dir`, and `checkpoints.resume` other than never (spx verify does both)")
        if self.nodes.count > 1 and (problem := multi_node_problem(
                self.launcher, self.checkpoints.dir is not None, self.checkpoints.resume)):
            raise ValueError(problem)
        return self

    @property
    def gpu_count(self) -> int:
        return len(self.gpus) if isinstance(self.gpus, list) else self.gpus

    @property
    def worker_count(self) -> int:
        """Worker processes: `procs`, else one per GPU (one for CPU jobs and plain python)."""
        if self.procs:
            return self.procs
        return 1 if self.launcher == "python" else max(1, self.gpu_count)

    def checkpoint_dir(self, checkpoints_root: Path) -> Path:
        """The job's checkpoint dir as accepted: intake writes the default into the spec
        (`with_checkpoint_dir`), so a spec without one is a job accepted before the default was per
        owner, whose checkpoints are in `checkpoints_root/NAME` (kept there across the upgrade)."""
        return self.checkpoints.dir or checkpoints_root / self.name

    def with_checkpoint_dir(self, checkpoints_root: Path, owner: str, owner_uid: int) -> JobSpec:
        """This spec with `checkpoints.dir` set: its own, else `checkpoints_root/OWNER/NAME`. Per
        owner, so a name nobody owns: a job never finds (resumes from, sets aside files in) a dir of
        another user's job of the same name."""
        if self.checkpoints.dir is not None:
            return self
        default = default_checkpoint_dir(checkpoints_root, owner, owner_uid, self.name)
        return self.model_copy(update={"checkpoints": self.checkpoints.model_copy(update={"dir": default})})


_OWNER_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$")


def owner_component(owner: str, owner_uid: int) -> str:
    """The owner's directory below checkpoints_root: their user name, or `uid-N` for a name that is
    no plain path component."""
    return owner if _OWNER_COMPONENT.match(owner) else f"uid-{owner_uid}"


def default_checkpoint_dir(checkpoints_root: Path, owner: str, owner_uid: int, name: str) -> Path:
    """`checkpoints_root/OWNER/NAME`: root makes `OWNER` and gives it to the owner; the rest is theirs."""
    return checkpoints_root / owner_component(owner, owner_uid) / name


def root_made(checkpoints_root: Path, ckpt_dir: Path, owner: str, owner_uid: int) -> Path | None:
    """The directory the daemon makes for the owner below checkpoints_root, root's own directory
    where the owner cannot: `checkpoints_root/OWNER` for a dir below it, or a one-component
    `checkpoints_root/NAME` (a job accepted before per-owner dirs, or one that names such a dir).
    None when `ckpt_dir` is not below checkpoints_root that way (the owner makes it, as the owner)."""
    try:
        parts = ckpt_dir.relative_to(checkpoints_root).parts
    except ValueError:
        return None
    if len(parts) == 1:
        return ckpt_dir
    if len(parts) > 1 and parts[0] == owner_component(owner, owner_uid):
        return checkpoints_root / parts[0]
    return None


# Paths `spx submit` resolves against the job file's directory when they are relative (the daemon
# itself takes only absolute ones: a dropped file has no directory of its own to be relative to).
# `script` and `deepspeed_config` stay relative to the workdir, as the launch runs them.
SUBMIT_RELATIVE_FIELDS = ("workdir", "python")


def resolve_relative(data: Any, base_dir: Path) -> Any:
    """`data` (a job file read as plain data) with a relative `workdir`/`python` made absolute
    against `base_dir`, normalised (no '..' left). Anything else is returned as it is."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for key in SUBMIT_RELATIVE_FIELDS:
        value = out.get(key)
        if isinstance(value, str) and value and not value.startswith("/"):
            out[key] = os.path.normpath(os.path.join(os.path.abspath(base_dir), value))
    return out


def submitted_text(text: str, base_dir: Path, source: str, fresh: bool = False) -> str:
    """What `spx submit` drops into the spool for a job file that `parse_spec(text, base_dir)`
    accepted: the text itself, or, when a path was relative or `fresh` (`--fresh`: `checkpoints.resume:
    never`) is asked, the document so changed (comments are not kept; a first line says where the
    file came from)."""
    _root, data = read_yaml(text)
    resolved = resolve_relative(data, base_dir)
    if fresh and isinstance(resolved, dict):
        checkpoints = resolved.get("checkpoints")
        resolved["checkpoints"] = {**(checkpoints if isinstance(checkpoints, dict) else {}), "resume": "never"}
    if resolved == data:
        return text
    header = (f"# spx submit {source}{' --fresh' if fresh else ''}: relative {'/'.join(SUBMIT_RELATIVE_FIELDS)} "
              f"resolved against {base_dir}\n")
    return header + yaml.safe_dump(resolved, sort_keys=False, default_flow_style=False, allow_unicode=True)


def parse_spec(text: str, base_dir: Path | None = None) -> JobSpec:
    """Validate a job file's text. Returns a JobSpec or raises SpecError (naming each bad field and its
    line) -- nothing else, for any text. With `base_dir` (`spx submit`: the job file's directory), a
    relative `workdir` or `python` is read as relative to it (see `resolve_relative`)."""
    try:
        return _parse(text, base_dir)
    except SpecError:
        raise
    except Exception as e:  # last resort: a parser bug must still read as "this file is bad", not a crash
        raise SpecError([(None, "", f"cannot read this file as a job spec ({type(e).__name__}: {str(e)[:200]})")]) from e


def _parse(text: str, base_dir: Path | None) -> JobSpec:
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise SpecError([(None, "", "file is not valid UTF-8 text")]) from None
    if size > MAX_SPEC_BYTES:
        raise SpecError([(None, "", f"file is larger than {MAX_SPEC_BYTES // 1024} KiB")])
    root, data = read_yaml(text)
    if base_dir is not None:
        data = resolve_relative(data, base_dir)
    if not isinstance(data, dict):
        raise SpecError([(root.start_mark.line + 1, "", "expected a mapping of job fields at the top level")])
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        errors = e.errors()
        problems = [_problem(root, err) for err in errors[:MAX_PROBLEMS]]
        if len(errors) > MAX_PROBLEMS:
            problems.append((None, "", f"... and {len(errors) - MAX_PROBLEMS} more problems"))
        raise SpecError(problems) from None


def _problem(root: yaml.Node, err: Any) -> tuple[int | None, str, str]:
    """One pydantic error as (line, field, message); union branch names are dropped from the path."""
    loc = tuple(p for p in err["loc"] if p not in _UNION_BRANCHES)
    field = ".".join(str(p) for p in loc)
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field (check the spelling; every field is in docs/job-spec.md)"
    return line_of(root, loc), field, msg
