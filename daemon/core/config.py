"""Daemon configuration: where everything lives and how the daemon behaves.

Loaded from `/etc/spx/config.yaml` (or `--config`), then overridden by command-line flags. `--root DIR`
(or `SPX_ROOT`) relocates every path under DIR so anyone can try the daemon without root (README.md, "Try it in 2 minutes").
Unknown keys are an error: a typo in a config must not silently fall back to a default.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from spx.daemon.core.notify_spec import Notify

DEFAULT_CONFIG_FILE = Path("/etc/spx/config.yaml")
GpuBackendKind = Literal["auto", "nvml", "fake", "none"]
# Whether the daemon manages per-attempt cgroups under its own (run/cgroups.py says when it may).
CgroupMode = Literal["auto", "on", "off"]


class ConfigError(Exception):
    """The config file or flags are unusable; the message says what and how to fix it."""


class GpuLimits(BaseModel):
    """Config `limits:` — GPUs one user's jobs may hold at once. A user's own entry wins; else the
    most generous entry among their groups (primary and supplementary); else `gpus_per_user`.
    None (the default) = no limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus_per_user: int | None = Field(None, ge=0, le=4096, description="Default for every user; null = no limit.")
    users: dict[str, int] = Field(default_factory=dict, description="Per user name: their limit.")
    groups: dict[str, int] = Field(default_factory=dict, description="Per group name: the limit of each member.")

    @property
    def any(self) -> bool:
        return self.gpus_per_user is not None or bool(self.users) or bool(self.groups)


class UserWork(BaseModel):
    """Config `user_work:` — the lanes (core.lanes) for work the daemon does on a user's behalf off the
    main loop: intake's checks as the owner, checkpoint discovery and attempt files as the user, stack
    dumps, root cause, a standby's handoff, the shared dir of a job across hosts. A user's stalls
    cost only their own slots."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    slots_per_owner: int = Field(4, ge=1, le=256, description=(
        "At most this many tasks of one owner run at once; more wait for that owner's next free slot (a job waiting "
        "so logs waiting_for_owner_slot, and no deadline of it runs meanwhile)."))
    slots_total: int = Field(32, ge=1, le=4096, description=(
        "At most this many tasks run at once in all; free slots go round robin over the owners with work waiting."))
    standby_handoff_seconds: float = Field(30.0, gt=0, le=3600, description=(
        "How long a pre-started launcher (launch_standby) may take to accept its attempt's plan (its imports must be "
        "done); past it the standby is discarded and the attempt launches cold."))


def check_root_only_above(path: Path) -> None:
    """A ConfigError unless every existing directory above `path` is owned by root (or the daemon's own
    uid) and writable by no one else (a sticky directory is fine: others cannot rename root's entries in
    it): a user who can rename a directory above it could put their own in its place, and decide what
    its reader (dcgm-exporter) is told."""
    owners = {0, os.geteuid()}
    for parent in path.resolve().parents:
        try:
            st = os.stat(parent)
        except OSError as e:
            raise ConfigError(f"{path}: {parent}: {e.strerror}") from e
        if not stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"{path}: {parent} is not a directory")
        open_to_others = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX
        if st.st_uid not in owners or open_to_others:
            raise ConfigError(f"{path}: {parent} is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}: "
                              "only root may be able to write the directories above it (chown root, chmod go-w)")


def _absolute(path: Path | None) -> Path | None:
    if path is not None and not path.is_absolute():
        raise ValueError(f"{path} is not an absolute path")
    return path


class MetricsSettings(BaseModel):
    """Config `metrics:` — what the daemon tells other monitoring on the host. (`metrics_address` and
    `metrics_job_labels`, about its own /metrics, are top-level keys.)"""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dcgm_job_mapping_dir: Path | None = Field(None, description=(
        "dcgm-exporter's --hpc-job-mapping-dir: the daemon writes there one file per GPU a job holds, named by the "
        "GPU's index and holding the job's name, and removes it when the job leaves the GPU, so dcgm-exporter "
        "labels that GPU's series hpc_job=NAME (docs/metrics.md). The daemon owns the directory: it is made "
        "root-owned 0755 (anything else at that name is moved aside), and every directory above it must be "
        "writable by root alone (checked at the daemon's start and by --check). null: no mapping files."))

    _abs = field_validator("dcgm_job_mapping_dir")(_absolute)


class Retention(BaseModel):
    """Config `retention:` — how long the history of finished jobs is kept, so nothing grows forever
    (run/retention.py does the removing, off the main loop; docs/retention.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    finished_jobs_days: float | None = Field(30.0, gt=0, le=36500, description=(
        "A job that ended this many days ago is removed: its store rows (job, attempts, events), its log dirs, "
        "its accepted copy in state_dir/jobs, its heartbeat dir; and spool/rejected/ files this old. null: kept "
        "forever. A job a live job's `after:` names is kept until that one starts."))
    logs_max_bytes: int | None = Field(20 * 1024**3, ge=0, description=(
        "Cap on the disk used by the log dirs of finished jobs: past it the oldest finished jobs' logs are removed "
        "first (their rows stay: `spx status` still shows them). Live jobs' logs are never counted or touched. "
        "null: no cap."))
    check_every_seconds: float = Field(300.0, ge=1, le=86400, description=(
        "How often the daemon looks for what to remove (sooner while a batch of expired jobs is still left)."))


class DaemonConfig(BaseModel):
    """Everything the daemon reads at start-up. Paths are absolute."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spool_dir: Path = Field(Path("/var/spool/spx"), description="Inbox users drop job files into.")
    state_dir: Path = Field(Path("/var/lib/spx"), description="SQLite store and accepted job files (root only).")
    log_dir: Path = Field(Path("/var/log/spx"), description="Per-attempt logs: NAME/attempt-N.log.")
    checkpoints_root: Path = Field(Path("/checkpoints"), description="Default parent of checkpoints.dir.")
    run_dir: Path = Field(Path("/run/spx"), description="Control socket and heartbeat files.")
    gpu_backend: GpuBackendKind = Field("auto", description="auto = NVML if a driver answers, else no GPUs.")
    fake_gpus: Path | None = Field(None, description="Fixture for --gpu-backend fake (default: bundled 8×H100).")
    metrics_address: str = Field("127.0.0.1:9101", description="HOST:PORT of /metrics; loopback by default.")
    metrics_job_labels: bool = Field(True, description=(
        "Name jobs and their owners in /metrics (the `spx_job` label on GPU series, and the per-job spx_job_* "
        "series, spx_job_info's `owner` among them). /metrics has no authentication: any local user (anyone who can "
        "reach metrics_address) can read it, so job and owner names are visible to all of them. false drops every "
        "job and owner name from the scrape; GPU series stay."))
    metrics_ended_jobs: int = Field(256, ge=0, le=10_000, description=(
        "How many of the jobs that ended in the last 24 hours /metrics shows (the newest; each is ~34 series, and "
        "SpxJobFailed reads their state): a scrape's time and the daemon's memory follow this, not the day's job "
        "count. `spx ls` shows them all."))
    straggler_threshold_percent: float = Field(10.0, gt=0, le=1000, description=(
        "A rank whose own work per step (spx.trainer's per-rank timing, in its heartbeat) is at least this much "
        "above the median of the job's ranks is a straggler: `spx status`/`spx top` name it with its GPU's "
        "evidence (clock, throttle reasons, temperature, power), and spx_job_straggler is set."))
    rescan_seconds: float = Field(5.0, gt=0, description="Spool rescan period, the backstop for inotify overflow.")
    submit_group: str | None = Field(None, description="If set, only root and this group's members may submit.")
    admin_group: str | None = Field(None, description="Members see and cancel every job, not only their own.")
    log_group: str | None = Field(None, description=(
        "Who besides root and the job's owner reads a job's logs (attempt-N.log, its rotated .1, the per-rank "
        "log dir, staging.log): unset, the owner alone (0600; never the owner's primary group, which on many "
        "hosts is everyone's `users`); set, this group's members too (0640 with this group). A name that is "
        "no group gives no one else access."))
    healthy_seconds: float = Field(600.0, gt=0, description=(
        "An attempt alive this long resets the backoff; for a script that writes no heartbeat (no step the daemon "
        "could see) it is also what counts as progress: three attempts in a row without progress are a crash loop."))
    log_max_bytes: int = Field(256 * 1024 * 1024, ge=4096, description=(
        "Cap on one attempt log file; past it the log rotates to attempt-N.log.1 (one kept), so an attempt's "
        "logs use at most twice this. Output that meets a full disk is dropped and counted in the log."))
    backup_every_seconds: float = Field(900.0, gt=0, description=(
        "How often the state store is backed up (SQLite online backup) into state_dir/backup/."))
    backup_keep: int = Field(8, ge=1, description="How many state store backups to keep (oldest removed first).")
    adopt_checkpoint_roots: list[Path] = Field(default_factory=list, description=(
        "Host loss (spot reclaim): directories on a persistent volume scanned at start, and again every "
        "adopt_lease_seconds, for jobs other hosts left there (CHECKPOINT_DIR/.spx/job.yaml, up to 3 levels "
        "down); every unfinished one no live host holds is queued here and resumes from its latest complete "
        "checkpoint (as `spx adopt DIR` does)."))
    adopt_lease_seconds: float = Field(120.0, ge=2, le=86400, description=(
        "How long a job's lease in CHECKPOINT_DIR/.spx/lease lasts without renewal (renewed every third of it "
        "while the job is live here). Another host adopts the job only once it expired: after a host loss, "
        "its jobs wait at most this long."))
    cgroups: CgroupMode = Field("auto", description=(
        "One cgroup v2 per attempt, so no process of it escapes a stop. auto = where systemd delegated the "
        "daemon's cgroup (Delegate=yes); on = the daemon's cgroup is its own, fail to start otherwise; off = never "
        "(processes are then found by their SPX_ATTEMPT_ID tag and process group only)."))
    local_checkpoint_root: Path | None = Field(Path("/dev/shm/spx"), description=(
        "Host-local checkpoint tier: each job gets a dir here (root-owned base, the job's own dir 0700), passed as "
        "SPX_LOCAL_CHECKPOINT_DIR; spx.trainer checkpoints there first (RAM by default) and replicates to the "
        "persistent checkpoint dir in the background. Removed when the job ends. null: off."))
    launch_standby: bool = Field(True, description=(
        "Start each torchrun/DeepSpeed attempt's launcher ahead, with its modules imported: the next attempt's while "
        "the current one trains (about one Python process with torch imported per job, no CUDA), a first attempt's "
        "while its checkpoint is looked for. It becomes the attempt's launcher when the attempt starts, so a "
        "relaunch skips the launcher's start-up. Each costs its memory (~230 MiB with torch): `spx status NAME` shows "
        "it, /metrics has spx_job_standby_memory_bytes per job and spx_standby_memory_bytes for the host. false "
        "(hosts short of RAM): every attempt starts cold, and that memory stays free."))
    user_work: UserWork = Field(default_factory=UserWork, description=(
        "Lanes for work done on users' behalf off the main loop: {slots_per_owner: 4, slots_total: 32, "
        "standby_handoff_seconds: 30}."))
    retention: Retention = Field(default_factory=Retention, description=(
        "How long finished jobs' history and logs are kept: {finished_jobs_days: 30, logs_max_bytes: 20 GiB, "
        "check_every_seconds: 300}; null turns a limit off (docs/retention.md)."))
    notify: Notify | None = Field(None, description=(
        "The notification of every job whose file has no `notify:` of its own (same fields: webhook, command, "
        "events, timeout_seconds; docs/notify.md). A command runs as the job's owner, never as root (except for "
        "root's own jobs)."))
    limits: GpuLimits = Field(default_factory=GpuLimits, description=(
        "GPUs one user's jobs may hold at once: {gpus_per_user: 4, users: {alice: 8}, groups: {ml: 6}}. A user's own "
        "entry wins, else the largest of their groups', else gpus_per_user (null: no limit). A job over its owner's "
        "limit waits (the reason says so), never fails; other users' jobs pass it."))
    metrics: MetricsSettings = Field(default_factory=MetricsSettings, description=(
        "What the daemon tells other monitoring: {dcgm_job_mapping_dir: /run/dcgm-job-map} writes dcgm-exporter's "
        "job-mapping files."))

    @model_validator(mode="after")
    def _job_names_public_or_not(self) -> DaemonConfig:
        if self.metrics.dcgm_job_mapping_dir is not None and not self.metrics_job_labels:
            raise ValueError("metrics.dcgm_job_mapping_dir puts job names into dcgm-exporter's metrics, which "
                             "metrics_job_labels: false keeps private: set one or the other")
        return self

    def check_host(self) -> None:
        """What only the daemon checks, on the host as it is now, at its start and in --check (a ConfigError
        if wrong): `spx`, run by users, loads the same config and must not trip on a directory they
        cannot search."""
        if self.metrics.dcgm_job_mapping_dir is not None:
            check_root_only_above(self.metrics.dcgm_job_mapping_dir)

    @classmethod
    def rooted(cls, root: Path, **overrides: object) -> DaemonConfig:
        """All paths under `root`: root/{spool,state,log,checkpoints,run,local-checkpoints}."""
        root = root.absolute()
        paths = {
            "spool_dir": root / "spool",
            "state_dir": root / "state",
            "log_dir": root / "log",
            "checkpoints_root": root / "checkpoints",
            "run_dir": root / "run",
            # Under the root too, so a rooted daemon (tests, a dev box) never leaves job dirs in /dev/shm.
            "local_checkpoint_root": root / "local-checkpoints",
        }
        return cls(**{**paths, **overrides})

    @property
    def store_path(self) -> Path:
        return self.state_dir / "spx.sqlite"

    @property
    def backup_dir(self) -> Path:
        return self.state_dir / "backup"

    @property
    def socket_path(self) -> Path:
        return self.run_dir / "spx.sock"

    @property
    def rejected_dir(self) -> Path:
        return self.spool_dir / "rejected"


def load_config(
    config_file: Path | None = None,
    root: Path | None = None,
    **flag_overrides: object,
) -> DaemonConfig:
    """Config file (if any) < `--root`/`SPX_ROOT` < explicit flags. None-valued flags are ignored."""
    data: dict = {}
    path = config_file or (DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.exists() else None)
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"{path}: cannot read config: {e}") from e
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of settings, got {type(loaded).__name__}")
        data.update(loaded)
    overrides = {k: v for k, v in flag_overrides.items() if v is not None}
    root = root or (Path(os.environ["SPX_ROOT"]) if os.environ.get("SPX_ROOT") else None)
    try:
        if root is not None:
            return DaemonConfig.rooted(root, **{**data, **overrides})
        return DaemonConfig(**{**data, **overrides})
    except ValidationError as e:
        where = f"{path}: " if path else ""
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" if err["loc"] else err["msg"]
                             for err in e.errors())
        raise ConfigError(f"{where}invalid config: {problems}") from e
