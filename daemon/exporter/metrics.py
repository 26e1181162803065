"""Every metric the exporter serves: name, type, labels and help, in one table.

This is the contract with the dashboards and alert rules (dashboards/); `docs/metrics.md` documents each
entry and a test checks the two agree. Names are the exposed ones (counters end in `_total`, info
metrics in `_info`); `Families` strips the suffix where prometheus-client wants the family name.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.core import Metric

# The job a series belongs to. Not `job`: Prometheus gives every series of a target the scrape job's
# name in `job` (and `instance`), and alert routing, `up{job=...}` and recording rules rely on it; an
# exporter that set `job` itself would need `honor_labels: true`, which lets it overwrite target labels.
JOB_LABEL = "spx_job"
GPU = ("gpu", "uuid")  # + "spx_job" while the GPU is allocated to a starting/running/restarting job


@dataclass(frozen=True)
class Spec:
    name: str
    type: str  # gauge | counter | info | histogram
    labels: tuple[str, ...]
    help: str


SPECS: tuple[Spec, ...] = (
    # -- per GPU ---------------------------------------------------------------------------------
    Spec("spx_gpu_up", "gauge", GPU, "1 if NVML answered for this GPU in this scrape, 0 if it errored (then no other sample of it is exported)."),
    Spec("spx_gpu_info", "info", (*GPU, "name", "pci_bus_id", "driver"), "GPU identity; always 1."),
    Spec("spx_gpu_utilization_ratio", "gauge", GPU, "Fraction of the last sample period (1/6 s to 1 s) a kernel was running (nvmlDeviceGetUtilizationRates.gpu)."),
    Spec("spx_gpu_memory_utilization_ratio", "gauge", GPU, "Fraction of the last sample period device memory was read or written."),
    Spec("spx_gpu_memory_used_bytes", "gauge", GPU, "Device memory allocated by processes (v2 info: excludes driver-reserved memory)."),
    Spec("spx_gpu_memory_free_bytes", "gauge", GPU, "Device memory free for allocation."),
    Spec("spx_gpu_memory_total_bytes", "gauge", GPU, "Device memory installed."),
    Spec("spx_gpu_memory_reserved_bytes", "gauge", GPU, "Device memory reserved by the driver and firmware (only where the driver has memory info v2)."),
    Spec("spx_gpu_power_watts", "gauge", GPU, "Current board power draw."),
    Spec("spx_gpu_power_limit_watts", "gauge", GPU, "Power limit currently enforced."),
    Spec("spx_gpu_energy_joules_total", "counter", GPU, "Energy consumed since the driver was loaded."),
    Spec("spx_gpu_temperature_celsius", "gauge", GPU, "GPU core temperature."),
    Spec("spx_gpu_memory_temperature_celsius", "gauge", GPU, "HBM temperature (where the GPU reports it)."),
    Spec("spx_gpu_sm_clock_hertz", "gauge", GPU, "Current SM clock."),
    Spec("spx_gpu_memory_clock_hertz", "gauge", GPU, "Current memory clock."),
    Spec("spx_gpu_clocks_event_active", "gauge", (*GPU, "reason"), "1 while that clocks-event (throttle) reason holds clocks down, else 0."),
    Spec("spx_gpu_pcie_transmit_bytes_per_second", "gauge", GPU, "PCIe transmit throughput over the driver's last 20 ms sample."),
    Spec("spx_gpu_pcie_receive_bytes_per_second", "gauge", GPU, "PCIe receive throughput over the driver's last 20 ms sample."),
    Spec("spx_gpu_pcie_transmit_bytes_total", "counter", GPU, "PCIe bytes transmitted (where the driver counts them)."),
    Spec("spx_gpu_pcie_receive_bytes_total", "counter", GPU, "PCIe bytes received (where the driver counts them)."),
    Spec("spx_gpu_ecc_errors_total", "counter", (*GPU, "type"), "Device memory ECC errors since the driver was loaded (volatile count); type corrected|uncorrected."),
    Spec("spx_gpu_remapped_rows", "gauge", (*GPU, "type"), "Row remapper: rows remapped for correctable|uncorrectable errors; pending|failure are 0/1 flags."),
    Spec("spx_gpu_xid_errors_total", "counter", (*GPU, "xid"), "XID critical-error events seen by the daemon's NVML event thread since it started."),
    Spec("spx_gpu_quarantined", "gauge", ("gpu", "uuid", "reason"), "1 while the health gate has the GPU quarantined (never allocated until `spx gpu release`), with the reason; 0 (reason empty) otherwise."),
    Spec("spx_gpu_process_memory_used_bytes", "gauge", (*GPU, "pid", "spx_job"), "Device memory used by one compute process; spx_job = the job whose attempt owns the pid (absent if none)."),
    Spec("spx_gpu_nvlink_up", "gauge", (*GPU, "link"), "1 if the NVLink link is active (or in low-power sleep), 0 if inactive."),
    Spec("spx_gpu_nvlink_transmit_bytes_total", "counter", (*GPU, "link"), "NVLink data payload transmitted on the link."),
    Spec("spx_gpu_nvlink_receive_bytes_total", "counter", (*GPU, "link"), "NVLink data payload received on the link."),
    Spec("spx_gpu_nvlink_errors_total", "counter", (*GPU, "link", "type"), "NVLink errors on the link; type crc_flit|crc_data|replay|recovery (only the types the GPU reports)."),
    # -- per job ---------------------------------------------------------------------------------
    Spec("spx_job_info", "info", ("spx_job", "owner"), "The job's owner (user name), for routing its alerts to them; always 1."),
    Spec("spx_job_state", "gauge", ("spx_job", "state"), "1 for the job's current state, 0 for the others."),
    Spec("spx_job_restarts_total", "counter", ("spx_job", "reason"), "Relaunches of the job, by the class of failure that caused them."),
    Spec("spx_job_step", "gauge", ("spx_job",), "Last global optimizer step in the job's heartbeat."),
    Spec("spx_job_samples_per_second", "gauge", ("spx_job",), "Training throughput in the job's last heartbeat."),
    Spec("spx_job_last_checkpoint_timestamp_seconds", "gauge", ("spx_job",), "Unix time of the job's latest complete checkpoint."),
    Spec("spx_job_gpus", "gauge", ("spx_job",), "GPUs the job holds now."),
    Spec("spx_job_attempts", "gauge", ("spx_job",), "Attempts started for the job (1 for a job that never restarted)."),
    Spec("spx_job_rank_step_seconds", "gauge", ("spx_job", "rank"), "Each rank's own work per optimizer step (spx.trainer: its forward pass, the best of its last few windows of steps), from the job's heartbeat; absent for scripts that do not report it."),
    Spec("spx_job_straggler", "gauge", ("spx_job", "rank", "gpu", "cause"), "How much slower than the median of the job's ranks its slowest rank is (0.14: 14 %), while at least straggler_threshold_percent; gpu = the GPU it runs on (empty: a CPU job), cause = thermal|power_brake|hw_slowdown|power_cap|sync_boost|link_errors|cpu_contention|low_clock|unknown from that GPU's NVML evidence."),
    Spec("spx_job_node_rank", "gauge", ("spx_job",), "This host's node rank in a job across hosts (torch's GROUP_RANK, from its heartbeat); absent for a one-host job."),
    Spec("spx_job_generation", "gauge", ("spx_job",), "A job across hosts: the generation (rendezvous round) its current or last attempt joined; it grows by one per restart of all hosts. Absent for a one-host job."),
    Spec("spx_job_seconds_total", "counter", ("spx_job", "cause"), "The job's settled wall time since it was submitted, by where it went (its goodput ledger: productive, recomputed, checkpoint, hang, restart_*, backoff, queued, daemon, ...). Time is settled once its cause is final (productive once a checkpoint keeps it), so no cause goes down; with spx_job_unsettled_seconds it sums to the job's wall time."),
    Spec("spx_job_unsettled_seconds", "gauge", ("spx_job",), "The job's time not yet settled in spx_job_seconds_total: its running attempt's training since its newest checkpoint (kept or recomputed, as it ends), a failed attempt's until its next attempt resumes, an attempt's time before its first heartbeat."),
    Spec("spx_job_standby_memory_bytes", "gauge", ("spx_job",), "Memory held by the job's standby, the next attempt's launcher started ahead with its modules (torch) imported (config launch_standby): the summed Pss of its processes (monitor, log relay, the launcher and any children), read at the scrape. Absent while the job has none."),
    Spec("spx_host_gpu_seconds_total", "counter", ("cause",), "The host's settled GPU-seconds since the daemon started, by where they went: the jobs' ledger causes times their GPUs, quarantined GPUs, idle GPUs; with spx_host_unsettled_gpu_seconds they sum to GPUs times the daemon's uptime."),
    Spec("spx_host_unsettled_gpu_seconds", "gauge", (), "The live jobs' GPU-seconds since the daemon started not yet settled in spx_host_gpu_seconds_total (their spx_job_unsettled_seconds times their GPUs)."),
    Spec("spx_standby_memory_bytes", "gauge", (), "Memory held by all jobs' standbys (spx_job_standby_memory_bytes summed, also without metrics_job_labels): what launch_standby: false would give back; 0 when there is none."),
    # -- daemon ----------------------------------------------------------------------------------
    Spec("spx_daemon_loop_turn_seconds", "histogram", (), "The daemon's main-loop turns since it started, by how long each took (from its start to the end of its last stage, not counting the wait for the next wake-up): everything the daemon does for its jobs waits on a turn."),
    Spec("spx_scrape_duration_seconds", "gauge", ("collector",), "Time this scrape spent in the collector."),
    Spec("spx_scrape_success", "gauge", ("collector",), "1 if the collector read everything it tried in this scrape, 0 if any read failed."),
    Spec("spx_nvml_errors_total", "counter", ("function",), "NVML calls that failed (NOT_SUPPORTED excluded), by function, since the daemon started."),
    Spec("spx_queue_drained", "gauge", (), "1 while the host is drained (`spx drain`: no new job starts; running jobs go on), else 0."),
    Spec("spx_retention_removed_jobs_total", "counter", (), "Finished jobs removed by retention (rows, events, log dirs: config retention.finished_jobs_days) since the daemon started."),
    Spec("spx_retention_removed_logs_total", "counter", (), "Finished jobs whose log dirs were removed to keep retention.logs_max_bytes (their rows stay) since the daemon started."),
    Spec("spx_retention_removed_rejected_total", "counter", (), "spool/rejected/ entries removed by retention since the daemon started."),
    Spec("spx_retention_finished_logs_bytes", "gauge", (), "Disk used by finished jobs' log dirs at retention's last sweep (absent before the first)."),
    Spec("spx_notify_sends_total", "counter", ("result",), "Notifications (`notify:` webhook or command) since the daemon started, by result: ok, failed (after every retry), dropped (too many of one owner waiting)."),
    Spec("spx_xid_watch_up", "gauge", (), "1 while the NVML XID event thread runs; 0 means XIDs are not being counted."),
    Spec("spx_build_info", "info", ("version",), "The daemon's version; always 1."),
    Spec("spx_gpu_backend_info", "info", ("kind",), "The GPU backend in use (nvml|fake|none); always 1."),
)

BY_NAME = {s.name: s for s in SPECS}


def family_name(spec: Spec) -> str:
    if spec.type == "counter":
        return spec.name.removesuffix("_total")
    if spec.type == "info":
        return spec.name.removesuffix("_info")
    return spec.name


class Families:
    """Fresh metric families for one collect(), keyed by exposed name, emitted in table order.

    Samples may carry different label sets within one family (a GPU's `spx_job` label exists only while
    it is allocated), which the typed *MetricFamily helpers do not allow.
    """

    def __init__(self, names: list[str]) -> None:
        self._metrics: dict[str, Metric] = {}
        for name in names:
            spec = BY_NAME[name]
            self._metrics[name] = Metric(family_name(spec), spec.help, spec.type)

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        self._metrics[name].add_sample(name, labels, float(value))

    def metrics(self) -> list[Metric]:
        return list(self._metrics.values())
