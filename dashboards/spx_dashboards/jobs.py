"""Dashboard 3, "spx-trainer / Jobs": state, restarts by reason, progress, checkpoints, goodput,
GPUs held."""

from __future__ import annotations

from . import grafana as g
from .common import JOB, JOB_STATE_CODES, TAG, standard_variables

STATE = "instance_spx_job:spx_job_state:code"
CKPT_AGE = "instance_spx_job:spx_job_checkpoint_age:seconds"
CKPT_INTERVAL = "instance_spx_job:spx_job_checkpoint_interval:avg6h"
GOODPUT = "instance_spx_job:spx_job_goodput:ratio"
BADPUT = "instance_spx_job_cause:spx_job_badput_seconds:rate5m"
# GPU series of held GPUs only: "All" (".*") also matches an idle GPU, which has no spx_job.
JOB_GPUS = f'{JOB}, spx_job!=""'


def _count_state(state: str) -> str:
    return f'count(spx_job_state{{{JOB}, state="{state}"}} == 1) or vector(0)'


def overview() -> list[g.Panel]:
    orange_if_any = g.steps(("green", None), ("orange", 1))
    return [
        g.row("Jobs"),
        g.stat("Running", "Jobs in state running.", [g.query(_count_state("running"))], w=4),
        g.stat("Queued", "Jobs waiting for GPUs.", [g.query(_count_state("queued"))], w=4),
        g.stat("Restarting", "Jobs between attempts (backoff, GPU checks).", [g.query(_count_state("restarting"))],
               w=4, thresholds=orange_if_any),
        g.stat("Failed", "Jobs the daemon stopped restarting.", [g.query(_count_state("failed"))], w=4,
               thresholds=g.steps(("green", None), ("red", 1))),
        g.stat("GPUs held", "GPUs allocated to the selected jobs.", [g.query(f"sum(spx_job_gpus{{{JOB}}}) or vector(0)")],
               w=4),
        g.stat("Restarts (time range)", "Relaunches of the selected jobs over the time range, all reasons.",
               [g.query(f"sum(increase(spx_job_restarts_total{{{JOB}}}[$__range])) or vector(0)")], w=4,
               decimals=0, thresholds=orange_if_any),
    ]


def job_table() -> list[g.Panel]:
    columns = {"A": "State", "B": "GPUs", "C": "Attempts", "D": "Step", "E": "Samples/s",
               "F": "Checkpoint age", "G": "Restarts", "H": "GPU util (mean)", "I": "info"}
    overrides = [
        g.unit_override("State", "short", {"mappings": JOB_STATE_CODES,
                                           "custom.cellOptions": {"type": "color-background"}}),
        g.unit_override("Checkpoint age", "s"),
        g.unit_override("GPU util (mean)", "percentunit"),
    ]
    by_job = "max by (instance, spx_job)"
    targets = [
        g.query(f"{by_job} ({STATE}{{{JOB}}})", table=True),
        g.query(f"{by_job} (spx_job_gpus{{{JOB}}})", table=True),
        g.query(f"{by_job} (spx_job_attempts{{{JOB}}})", table=True),
        g.query(f"{by_job} (spx_job_step{{{JOB}}})", table=True),
        g.query(f"{by_job} (spx_job_samples_per_second{{{JOB}}})", table=True),
        g.query(f"{by_job} ({CKPT_AGE}{{{JOB}}})", table=True),
        g.query(f"sum by (instance, spx_job) (spx_job_restarts_total{{{JOB}}})", table=True),
        g.query(f"avg by (instance, spx_job) (spx_gpu_utilization_ratio{{{JOB_GPUS}}})", table=True),
        g.query(f"max by (instance, spx_job, owner) (spx_job_info{{{JOB}}})", table=True),  # the owner column
    ]
    return [
        g.table("Jobs", "One row per job the daemon reports, with its owner. Checkpoint age is the time since "
                "the last complete checkpoint (alert SpxJobCheckpointStale).", targets,
                transformations=g.merged(columns, ["Value #I"], ["spx_job", "owner", "instance",
                                                                 *[c for c in columns.values() if c != "info"]]),
                overrides=overrides, h=8),
        g.state_timeline("State over time", "Job state as the daemon reports it.",
                         [g.query(f"max by (instance, spx_job) ({STATE}{{{JOB}}})", "{{spx_job}} @ {{instance}}")],
                         mappings=JOB_STATE_CODES, h=7),
    ]


def progress() -> list[g.Panel]:
    return [
        g.row("Progress and checkpoints"),
        g.timeseries("Step", "Global optimizer step from the job's heartbeat (alert SpxJobHung when it stops "
                     "moving while running).", [g.query(f"max by (spx_job) (spx_job_step{{{JOB}}})", "{{spx_job}}")]),
        g.timeseries("Samples per second", "Throughput from the job's heartbeat.",
                     [g.query(f"max by (spx_job) (spx_job_samples_per_second{{{JOB}}})", "{{spx_job}}")], min_=0),
        g.timeseries("Time since last checkpoint", "Age of the latest complete checkpoint.",
                     [g.query(f"max by (spx_job) ({CKPT_AGE}{{{JOB}}})", "{{spx_job}}")], unit="s", min_=0),
        g.timeseries("Checkpoint interval (observed)", "Mean time between checkpoints over the last 6 h; the "
                     "stale-checkpoint alert fires at 3 × this (at least 15 min).",
                     [g.query(f"max by (spx_job) ({CKPT_INTERVAL}{{{JOB}}})", "{{spx_job}}")], unit="s", min_=0),
        g.timeseries("Per-rank step time", "Each rank's own work per step (spx.trainer's forward time, from the "
                     "heartbeat): one line far above the others is a straggler the whole job waits for.",
                     [g.query(f"max by (spx_job, rank) (spx_job_rank_step_seconds{{{JOB}}})", "{{spx_job}} rank {{rank}}")],
                     unit="s", min_=0),
        g.timeseries("Straggler", "How much slower than the median the slowest rank is, with the cause read from "
                     "its GPU (alert SpxJobStraggler; `spx status` says the evidence).",
                     [g.query(f"max by (spx_job, rank, gpu, cause) (spx_job_straggler{{{JOB}}})",
                              "{{spx_job}} rank {{rank}} GPU {{gpu}} {{cause}}")], unit="percentunit", min_=0),
    ]


def restarts() -> list[g.Panel]:
    return [
        g.row("Restarts"),
        g.bargauge("Restarts by reason (since submission)", "crash, signal, oom, hang, preempted, daemon-restart, "
                   "gpu-fault: why each relaunch happened.",
                   [g.query(f"sum by (spx_job, reason) (spx_job_restarts_total{{{JOB}}})", "{{spx_job}} · {{reason}}")],
                   w=8),
        g.timeseries("Restarts", "Relaunches per interval by reason (alert SpxJobCrashLooping).",
                     [g.query(f"sum by (spx_job, reason) (increase(spx_job_restarts_total{{{JOB}}}[$__rate_interval]))",
                              "{{spx_job}} · {{reason}}")], bars=True, min_=0, w=8),
        g.timeseries("Attempts", "Attempts started per job.",
                     [g.query(f"max by (spx_job) (spx_job_attempts{{{JOB}}})", "{{spx_job}}")], min_=0, w=8),
    ]


def goodput() -> list[g.Panel]:
    """The goodput ledger (docs/metrics.md): where each second of the jobs' lives went."""
    return [
        g.row("Goodput"),
        g.timeseries("Goodput (since submission)", "Share of each job's settled time holding GPUs that produced "
                     "kept training: productive / all but queued (its goodput ledger).",
                     [g.query(f"max by (spx_job) ({GOODPUT}{{{JOB}}})", "{{spx_job}}")],
                     unit="percentunit", min_=0, max_=1, w=8),
        g.timeseries("Badput by cause", "Seconds per second the selected jobs lost, stacked by cause (recomputed "
                     "steps, checkpoint stalls, hangs, restart phases, backoff, daemon outages, ...); 1 is one "
                     "job's whole time. Recomputed time shows when the failed attempt's successor resumes.",
                     [g.query(f"sum by (cause) ({BADPUT}{{{JOB}}})", "{{cause}}")], stack=True, min_=0, w=8),
        g.timeseries("Not yet settled", "Each job's time not in the ledger's counters yet: its running attempt's "
                     "training since its newest checkpoint (kept or recomputed as the attempt ends).",
                     [g.query(f"max by (spx_job) (spx_job_unsettled_seconds{{{JOB}}})", "{{spx_job}}")],
                     unit="s", min_=0, w=8),
    ]


def resources() -> list[g.Panel]:
    return [
        g.row("GPUs held"),
        g.timeseries("GPUs held", "GPUs allocated to each job, summed over its hosts.",
                     [g.query(f"sum by (spx_job) (spx_job_gpus{{{JOB}}})", "{{spx_job}}")], min_=0, w=6),
        g.timeseries("GPU utilization (mean over the job's GPUs)", "Mean utilization of the GPUs each job holds.",
                     [g.query(f"avg by (spx_job) (spx_gpu_utilization_ratio{{{JOB_GPUS}}})", "{{spx_job}}")],
                     unit="percentunit", min_=0, max_=1, w=6),
        g.timeseries("GPU memory used", "Device memory used on the GPUs each job holds.",
                     [g.query(f"sum by (spx_job) (spx_gpu_memory_used_bytes{{{JOB_GPUS}}})", "{{spx_job}}")],
                     unit="bytes", min_=0, w=6),
        g.timeseries("GPU power", "Power drawn by the GPUs each job holds.",
                     [g.query(f"sum by (spx_job) (spx_gpu_power_watts{{{JOB_GPUS}}})", "{{spx_job}}")],
                     unit="watt", min_=0, w=6),
        g.timeseries("Standby launcher memory", "Host memory held by each job's standby: its next attempt's "
                     "launcher, started ahead with torch imported so a relaunch skips that start-up (config "
                     "launch_standby; the host's total is on the Host GPUs dashboard).",
                     [g.query(f"sum by (spx_job) (spx_job_standby_memory_bytes{{{JOB}}})", "{{spx_job}}")],
                     unit="bytes", min_=0, w=24, h=6),
    ]


def build() -> dict:
    return g.dashboard(
        "spx-jobs", "spx-trainer / Jobs",
        "Training jobs supervised by spx-trainer: state, restarts by reason, step and samples/s, checkpoint "
        "age, goodput and badput by cause, and the GPUs each job holds.",
        tags=[TAG, "jobs"], variables=standard_variables(multi_instance=True),
        panels=[*overview(), *job_table(), *progress(), *goodput(), *restarts(), *resources()],
        links=g.dashboard_links(TAG),
    )
