"""Read-only snapshots of jobs, as the CLI (`--json`), the metrics and `systemctl status` see them.

One shape for every reader, so `spx ls --json`, `/metrics` and the STATUS line can never disagree.
Built by `jobviews` from the state store plus each job's heartbeat; stdlib-only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from spx.daemon.state.node_view import NodeView


@dataclass(frozen=True)
class AttemptView:
    """One launch of a job. `reason` says why it ended (e.g. "exit code 1", "signal SIGKILL",
    "hang: no step progress for 900 s", "preempted", "cancelled"); `reason_class` is its failure
    class (policy.failure_class: "user-code", "communication", "oom", "cuda", "gpu-fault", "hang",
    "preempted", "signal", "crash", or "lost", "launch", "cancelled", "daemon-restart", "peer-restart"; None for a
    success or an attempt still running); `root_cause` is the one-line cause found in its log (the
    rank that failed first and its exception, other ranks' errors as consequences), when found."""

    number: int
    start: float | None
    end: float | None
    exit_code: int | None
    signal: int | None
    reason: str | None
    resumed_from_step: int | None
    resumed_from: str | None
    root_cause: str | None = None
    reason_class: str | None = None
    # When each phase of its (re)start ended, Unix seconds (run/timeline.py; `spx status --timeline`).
    phases: dict[str, float] = field(default_factory=dict)
    # Where it resumed from and why there: the layout recognised, candidates skipped with reasons,
    # `fallback_from` when a crash loop made it pass over the newest (contract/checkpoint_discovery).
    checkpoint: dict | None = None
    # The last step its heartbeats reported (recorded at its end; None while it runs or without a
    # heartbeat): where its line ends in `spx report`'s picture.
    max_step: int | None = None


@dataclass(frozen=True)
class JobView:
    """A job as users and metrics see it (the fields of `spx ls --json` and `spx status --json`, plus
    what metrics need).

    `restarts_by_reason` counts relaunches by the class of the failure that caused them (the
    attempts' `reason_class`: "user-code", "communication", "oom", "cuda", "gpu-fault", "hang",
    "preempted", "signal", "crash", "daemon-restart", "lost", "launch"). Times are Unix seconds.
    """

    name: str
    state: str
    reason: str | None
    owner_uid: int
    owner: str
    attempts: int
    step: int | None
    epoch: int | None
    samples_per_second: float | None
    last_checkpoint_step: int | None
    last_checkpoint_time: float | None
    gpus: list[int]
    submitted: float
    priority: int = 0
    restarts_by_reason: dict[str, int] = field(default_factory=dict)
    pids: list[int] = field(default_factory=list)
    # What its standby (the next attempt's launcher, started ahead: config `launch_standby`) holds in
    # memory now, its processes' summed Pss in bytes (state/standby_memory.py); None without one.
    standby_memory_bytes: int | None = None
    # Of it, workers started ahead (`restart.standby_workers`: one per local rank); 0 without.
    standby_workers: int = 0
    staging: str | None = None
    history: list[AttemptView] = field(default_factory=list)
    # The store's id: tells apart the jobs of a reused name (`spx ls --all`, `spx logs --job-id`).
    job_id: int = 0
    # This host's node of a job across hosts (state/node_view.py); None for a one-host job.
    node: NodeView | None = None
    # Why the job's heartbeat file is no heartbeat (garbage, a link, too large); None when it is one
    # or there is none yet. `spx status` shows it as "heartbeat unreadable: …".
    heartbeat_problem: str | None = None
    # False when no heartbeat was ever read for the job (a script that does not use the trainer
    # library): the daemon then sees a checkpoint only when an attempt resumes from it, so
    # `last_checkpoint_step` is the newest one resumed from and newer ones may exist on disk.
    checkpoints_tracked: bool = True
    # Each global rank's own work per step (seconds) in the running attempt's heartbeat (spx.trainer
    # gathers it every few steps); None when not reported.
    rank_step_seconds: list[float] | None = None
    # Slow ranks named and explained (gpu/straggler.py `Straggler.to_json`): the rank at least the
    # threshold slower than the median, with its GPU's evidence; for a script without rank times,
    # its throttled GPUs. Filled by the service, which holds the GPU evidence.
    stragglers: list[dict] = field(default_factory=list)
    # Where every second of the job's life went, by cause (state/goodput.py `Ledger.to_json`):
    # wall_seconds, gpus, goodput, seconds and gpu_seconds by cause. None where not computed.
    ledger: dict | None = None
    # Replays of its checkpoints (`spx verify`) and their verdicts, newest first
    # (run/verification.py's documents: text, replay, replay_gpus, trained_on, suspect, verdict, time).
    verifications: list[dict] = field(default_factory=list)

    def to_json(self, with_history: bool = False) -> dict:
        doc = asdict(self)
        if not with_history:
            doc.pop("history")
            doc.pop("verifications")
        return doc
