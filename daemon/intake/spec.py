"""The job spec: one YAML file = one job (design §3).

Parsing is defensive because the daemon runs as root and the file comes from a user: the YAML is
composed with the safe loader, anchors/aliases and deep nesting are refused (alias bombs), unknown
keys are errors (a typo must not be silently ignored), and every error names the field and its line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

MAX_SPEC_BYTES = 64 * 1024
MAX_DEPTH = 16
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
# Variables the daemon owns; a job setting them would break supervision or GPU isolation.
RESERVED_ENV = re.compile(r"^(SPX_.*|CUDA_VISIBLE_DEVICES|CUDA_DEVICE_ORDER|MASTER_ADDR|MASTER_PORT|RANK|WORLD_SIZE|LOCAL_RANK|NVIDIA_VISIBLE_DEVICES)$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SpecError(Exception):
    """A job file is unusable. `problems` are (line or None, field path, message) triples."""

    def __init__(self, problems: list[tuple[int | None, str, str]]):
        self.problems = problems
        super().__init__(self.render())

    def render(self, filename: str = "") -> str:
        lines = []
        for line, field, msg in self.problems:
            where = filename + (f":{line}" if line else "")
            prefix = f"{where}: " if where else ""
            lines.append(f"{prefix}{field + ': ' if field else ''}{msg}")
        return "\n".join(lines)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _absolute(p: Path) -> Path:
    if not p.is_absolute():
        raise ValueError("must be an absolute path")
    if ".." in p.parts:
        raise ValueError("must not contain '..'")
    return p


AbsPath = Annotated[Path, Field(description="An absolute path without '..'.")]


class Checkpoints(_Strict):
    dir: AbsPath | None = Field(None, description="Where this job's checkpoints live; default CHECKPOINTS_ROOT/NAME.")
    keep: int = Field(3, ge=1, description="Complete checkpoints kept; older ones are deleted after a newer one completes.")
    pattern: str | None = Field(
        None, description="Glob for scripts with their own naming (`ckpt.pt`, `checkpoint-*/`); default: the step-*/ layout."
    )

    _abs = field_validator("dir")(lambda v: v if v is None else _absolute(v))

    @field_validator("pattern")
    @classmethod
    def _relative_glob(cls, v: str | None) -> str | None:
        if v is not None and (v.startswith("/") or ".." in Path(v).parts or not v.strip()):
            raise ValueError("must be a glob relative to checkpoints.dir, without '..'")
        return v


class Restart(_Strict):
    max_restarts: int = Field(10, ge=0, description="Relaunches allowed before the job fails.")
    backoff_seconds: tuple[float, float] = Field(
        (10.0, 300.0), description="[first, cap] of the exponential backoff between attempts."
    )
    hang_timeout_seconds: float = Field(900.0, gt=0, description="No heartbeat step progress this long = hang.")
    on_exit_codes: Literal["any"] | list[int] = Field(
        "any", description="Exit codes that are restarted; any other non-zero code fails the job."
    )

    @field_validator("backoff_seconds")
    @classmethod
    def _ordered(cls, v: tuple[float, float]) -> tuple[float, float]:
        if v[0] < 0 or v[1] < v[0]:
            raise ValueError("must be [first, cap] with 0 <= first <= cap")
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


class Nodes(_Strict):
    count: int = Field(1, ge=1, le=1, description="Multi-node jobs are not supported yet (design §7).")


class JobSpec(_Strict):
    """A validated job. Field descriptions are the reference in the README."""

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
    nodes: Nodes = Field(default_factory=lambda: Nodes())
    checkpoints: Checkpoints = Field(default_factory=lambda: Checkpoints())
    resume_args: list[str] = Field(default_factory=list, description="Appended only when resuming.")
    restart: Restart = Field(default_factory=lambda: Restart())
    stop: Stop = Field(default_factory=lambda: Stop())
    data: Data = Field(default_factory=lambda: Data())
    priority: int = Field(0, ge=-1000, le=1000, description="Higher runs first; FIFO within a priority.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(
                "must match [a-z0-9][a-z0-9-_.]{0,62} (lower-case letters, digits, '-', '_', '.'; "
                "no '/' and at most 63 characters)"
            )
        return v

    _abs = field_validator("workdir", "python")(lambda v: v if v is None else _absolute(v))

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: int | list[int]) -> int | list[int]:
        if isinstance(v, int) and not 0 <= v <= 64:
            raise ValueError("must be a count between 0 and 64, or a list of GPU indices")
        if isinstance(v, list) and (not v or len(set(v)) != len(v) or min(v) < 0):
            raise ValueError("an explicit list must be non-empty, without duplicates, of indices >= 0")
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
        if self.launcher == "python" and self.worker_count > 1:
            raise ValueError("launcher: python runs one process; use torchrun for procs > 1")
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
        return self.checkpoints.dir or checkpoints_root / self.name


# --- parsing --------------------------------------------------------------------------------------


def _check_tree(node: yaml.Node, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise SpecError([(node.start_mark.line + 1, "", f"nesting deeper than {MAX_DEPTH} levels")])
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            _check_tree(k, depth + 1)
            _check_tree(v, depth + 1)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _check_tree(item, depth + 1)


def _refuse_aliases(text: str) -> None:
    """Scan events before composing: an alias bomb expands at compose time, so refuse anchors and
    aliases while they are still tokens."""
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                line = event.start_mark.line + 1 if event.start_mark else None
                raise SpecError([(line, "", "YAML anchors/aliases are not allowed in job files")])
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise SpecError([(mark.line + 1 if mark else None, "", f"invalid YAML: {getattr(e, 'problem', e)}")]) from e


def _line_of(root: yaml.Node | None, loc: tuple) -> int | None:
    """Line of the deepest node along `loc` (a pydantic error location) in the composed YAML."""
    node, line = root, (root.start_mark.line + 1 if root is not None else None)
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
            key = next((k for k, _ in node.value if getattr(k, "value", None) == part), None)
            if match is None:
                break
            line = (key or match).start_mark.line + 1
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def parse_spec(text: str) -> JobSpec:
    """Validate a job file's text. Raises SpecError naming each bad field and its line."""
    if len(text.encode()) > MAX_SPEC_BYTES:
        raise SpecError([(None, "", f"file is larger than {MAX_SPEC_BYTES // 1024} KiB")])
    _refuse_aliases(text)
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is None:
        raise SpecError([(None, "", "file is empty; a job needs at least `name` and `script`")])
    _check_tree(root)
    data: Any = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise SpecError([(root.start_mark.line + 1, "", "expected a mapping of job fields at the top level")])
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p in ("int", "list[int]", "literal['any']")))
            field = ".".join(str(p) for p in loc)
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown field (check the spelling; see the job spec reference in the README)"
            problems.append((_line_of(root, loc), field, msg))
        raise SpecError(problems) from None
