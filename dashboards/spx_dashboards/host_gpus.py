"""Dashboard 1, "spx-trainer / Host GPUs": one host's GPUs, the job on each, and their faults."""

from __future__ import annotations

from . import grafana as g
from .common import ACTIVE, GPU, HOST, TAG, UP_DOWN, standard_variables

PERF_LIMITING = "hw_slowdown|hw_thermal_slowdown|sw_thermal_slowdown|hw_power_brake|sw_power_cap"
RED_IF_ANY = g.steps(("green", None), ("red", 1))


def _per_gpu(metric: str, extra: str = "") -> str:
    # `max by (gpu)` drops the spx_job label, so a GPU that moves between jobs stays one line.
    return f"max by (gpu) ({metric}{{{GPU}{extra}}})"


def overview() -> list[g.Panel]:
    return [
        g.row("Overview"),
        g.stat("GPUs up", "GPUs whose NVML reads succeed on the last scrape.",
               [g.query(f"sum(spx_gpu_up{{{HOST}}})")], w=3),
        g.stat("GPUs down", "GPUs reporting spx_gpu_up 0 (NVML errors; see alert SpxGpuDown).",
               [g.query(f"count(spx_gpu_up{{{HOST}}} == 0) or vector(0)")], w=3, thresholds=RED_IF_ANY),
        g.stat("GPUs allocated", "GPUs held by a spx job right now.",
               [g.query(f'count(spx_gpu_info{{{HOST}, spx_job!=""}}) or vector(0)')], w=3),
        g.stat("Power draw", "Sum of the selected GPUs' power draw.",
               [g.query(f"sum(spx_gpu_power_watts{{{GPU}}})")], unit="watt", w=3),
        g.stat("Energy (time range)", "Energy used by the selected GPUs over the dashboard's time range.",
               [g.query(f"sum(increase(spx_gpu_energy_joules_total{{{GPU}}}[$__range]))")], unit="joule", w=3),
        g.stat("XID events", "XID events counted since the daemon started (alert SpxGpuXidError).",
               [g.query(f"sum(spx_gpu_xid_errors_total{{{GPU}}}) or vector(0)")], w=3, thresholds=RED_IF_ANY),
        g.stat("NVLink links down", "Links reporting down (alert SpxNvlinkDown); details on the NVLink dashboard.",
               [g.query(f"count(spx_gpu_nvlink_up{{{GPU}}} == 0) or vector(0)")], w=3, thresholds=RED_IF_ANY),
        g.stat("Model / driver", "GPU model and driver version, with the number of such GPUs.",
               [g.query(f"count by (name, driver) (spx_gpu_info{{{HOST}}})", "{{name}} · driver {{driver}}")],
               w=3, text_mode="name"),
    ]


def goodput() -> list[g.Panel]:
    """The host's account of its GPU time since the daemon started (the jobs' goodput ledgers)."""
    return [
        g.row("Goodput"),
        g.timeseries("Host goodput (since the daemon started)", "Share of the host's settled GPU-seconds that "
                     "produced kept training (idle and quarantined GPUs count against it).",
                     [g.query(f"max by (instance) (instance:spx_host_goodput:ratio{{{HOST}}})", "{{instance}}")],
                     unit="percentunit", min_=0, max_=1, w=8),
        g.timeseries("Host badput by cause (GPUs' worth)", "GPUs' worth of time lost, stacked by cause: the jobs' "
                     "recomputed steps, checkpoint stalls, hangs, restarts, backoff, ..., and idle and "
                     "quarantined GPUs.",
                     [g.query(f"sum by (cause) (instance_cause:spx_host_badput_gpu_seconds:rate5m{{{HOST}}})",
                              "{{cause}}")], stack=True, min_=0, w=8),
        g.timeseries("GPU-seconds not yet settled", "The running jobs' GPU-seconds not in the counters yet "
                     "(training since each one's newest checkpoint).",
                     [g.query(f"max by (instance) (spx_host_unsettled_gpu_seconds{{{HOST}}})", "{{instance}}")],
                     unit="s", min_=0, w=8),
    ]


def gpu_table() -> list[g.Panel]:
    columns = {"A": "info", "B": "Up", "C": "GPU util", "D": "Memory used", "E": "Memory used %",
               "F": "Memory busy", "G": "Power", "H": "Temperature", "I": "SM clock"}
    overrides = [
        g.unit_override("Up", "short", {"mappings": UP_DOWN, "custom.cellOptions": {"type": "color-text"}}),
        g.unit_override("GPU util", "percentunit"),
        g.unit_override("Memory used", "bytes"),
        g.unit_override("Memory used %", "percentunit"),
        g.unit_override("Memory busy", "percentunit"),
        g.unit_override("Power", "watt"),
        g.unit_override("Temperature", "celsius"),
        g.unit_override("SM clock", "hertz"),
    ]
    targets = [
        g.query(f"max by (gpu, name, uuid, pci_bus_id, spx_job) (spx_gpu_info{{{GPU}}})", table=True),
        g.query(_per_gpu("spx_gpu_up"), table=True),
        g.query(_per_gpu("spx_gpu_utilization_ratio"), table=True),
        g.query(_per_gpu("spx_gpu_memory_used_bytes"), table=True),
        g.query(f"{_per_gpu('spx_gpu_memory_used_bytes')} / {_per_gpu('spx_gpu_memory_total_bytes')}", table=True),
        g.query(_per_gpu("spx_gpu_memory_utilization_ratio"), table=True),
        g.query(_per_gpu("spx_gpu_power_watts"), table=True),
        g.query(_per_gpu("spx_gpu_temperature_celsius"), table=True),
        g.query(_per_gpu("spx_gpu_sm_clock_hertz"), table=True),
    ]
    order = ["gpu", "spx_job", "name", "uuid", "pci_bus_id", *[c for c in columns.values() if c != "info"]]
    return [
        g.row("GPUs"),
        g.table("GPUs and their jobs", "One row per GPU. The spx_job column names the job that holds the GPU; "
                "it is empty for an idle GPU.",
                targets, transformations=g.merged(columns, ["Value #A"], order), overrides=overrides, h=9),
        g.state_timeline("Job on each GPU", "Which spx job held each GPU over time; 'idle' when none.",
                         [g.query(f"max by (gpu, spx_job) (spx_gpu_info{{{GPU}, spx_job!=\"\"}}) or "
                                  f"label_replace(0 * max by (gpu) (spx_gpu_info{{{GPU}, spx_job=\"\"}}), "
                                  f"\"spx_job\", \"idle\", \"spx_job\", \"\")", "GPU {{gpu}} · {{spx_job}}")],
                         mappings=g.value_map({"1": ("held", "green"), "0": ("idle", "text")}), h=8),
    ]


def utilization() -> list[g.Panel]:
    return [
        g.row("Utilization and memory"),
        g.timeseries("GPU utilization", "Fraction of time a kernel was running (NVML utilization.gpu).",
                     [g.query(_per_gpu("spx_gpu_utilization_ratio"), "GPU {{gpu}}")],
                     unit="percentunit", min_=0, max_=1),
        g.timeseries("Memory controller busy", "Fraction of time device memory was read or written.",
                     [g.query(_per_gpu("spx_gpu_memory_utilization_ratio"), "GPU {{gpu}}")],
                     unit="percentunit", min_=0, max_=1),
        g.timeseries("Memory used", "Device memory in use per GPU.",
                     [g.query(_per_gpu("spx_gpu_memory_used_bytes"), "GPU {{gpu}}")], unit="bytes", min_=0),
        g.timeseries("Memory free", "Device memory free.",
                     [g.query(_per_gpu("spx_gpu_memory_free_bytes"), "GPU {{gpu}}")], unit="bytes", min_=0),
    ]


def power_thermal() -> list[g.Panel]:
    return [
        g.row("Power and temperature"),
        g.timeseries("Power draw", "Power per GPU, and the enforced power limit of the hottest-capped GPU.",
                     [g.query(_per_gpu("spx_gpu_power_watts"), "GPU {{gpu}}"),
                      g.query(f"max(spx_gpu_power_limit_watts{{{GPU}}})", "power limit")], unit="watt", min_=0),
        g.timeseries("Temperature", "GPU core temperature.",
                     [g.query(_per_gpu("spx_gpu_temperature_celsius"), "GPU {{gpu}}")], unit="celsius"),
    ]


def clocks() -> list[g.Panel]:
    return [
        g.row("Clocks and throttle reasons"),
        g.timeseries("SM clock", "Streaming-multiprocessor clock.",
                     [g.query(_per_gpu("spx_gpu_sm_clock_hertz"), "GPU {{gpu}}")], unit="hertz"),
        g.timeseries("Memory clock", "Device memory clock.",
                     [g.query(_per_gpu("spx_gpu_memory_clock_hertz"), "GPU {{gpu}}")], unit="hertz"),
        g.state_timeline("Performance-limited", "A GPU is limited when a power cap, thermal or hardware "
                         f"slowdown reason is active ({PERF_LIMITING.replace('|', ', ')}).",
                         [g.query(_per_gpu("spx_gpu_clocks_event_active", f', reason=~"{PERF_LIMITING}"'),
                                  "GPU {{gpu}}")],
                         mappings=g.value_map({"0": ("ok", "green"), "1": ("limited", "orange")}), w=12),
        g.table("Clock event reasons now (GPU × reason)", "Reasons the driver holds clocks down right now. "
                "gpu_idle is normal on an idle GPU; thermal and hw_* reasons are not.",
                [g.query(f"max by (gpu, reason) (spx_gpu_clocks_event_active{{{GPU}}})", table=True)],
                transformations=g.matrix("gpu", "reason"), mappings=ACTIVE, cell="color-background", w=12),
        g.timeseries("GPUs per clock event reason", "How many of the selected GPUs have each reason active.",
                     [g.query(f"sum by (reason) (spx_gpu_clocks_event_active{{{GPU}}})", "{{reason}}")],
                     min_=0, w=24),
    ]


def pcie() -> list[g.Panel]:
    return [
        g.row("PCIe"),
        g.timeseries("PCIe transmit", "Bytes per second the GPU sends over PCIe.",
                     [g.query(_per_gpu("spx_gpu_pcie_transmit_bytes_per_second"), "GPU {{gpu}}")],
                     unit="Bps", min_=0),
        g.timeseries("PCIe receive", "Bytes per second the GPU receives over PCIe.",
                     [g.query(_per_gpu("spx_gpu_pcie_receive_bytes_per_second"), "GPU {{gpu}}")],
                     unit="Bps", min_=0),
    ]


def errors() -> list[g.Panel]:
    xid_columns = {"A": "Events since daemon start", "B": "Events in time range"}
    return [
        g.row("Errors: XID, ECC, row remapping"),
        g.table("XID events (GPU × XID)", "XID events by code. 79 (fallen off the bus), 48/95 (uncorrectable "
                "ECC), 74 (NVLink) and 119/120 (GSP) need the GPU drained; see docs/dashboards.md.",
                [g.query(f"max by (gpu, xid) (spx_gpu_xid_errors_total{{{GPU}}})", table=True),
                 g.query(f"max by (gpu, xid) (increase(spx_gpu_xid_errors_total{{{GPU}}}[$__range]))", table=True)],
                transformations=g.merged(xid_columns, [], ["gpu", "xid", *xid_columns.values()]),
                thresholds=RED_IF_ANY, cell="color-text", no_value="No XID events", w=12),
        g.timeseries("XID events", "XID events per scrape interval, by GPU and code.",
                     [g.query(f"sum by (gpu, xid) (increase(spx_gpu_xid_errors_total{{{GPU}}}[$__rate_interval]))",
                              "GPU {{gpu}} XID {{xid}}")], bars=True, min_=0),
        g.table("ECC errors (GPU × type)", "ECC error counters. Uncorrected errors kill the job on that GPU "
                "(alert SpxGpuEccUncorrectable); a rising corrected count predicts row remapping.",
                [g.query(f"max by (gpu, type) (spx_gpu_ecc_errors_total{{{GPU}}})", table=True)],
                transformations=g.matrix("gpu", "type"), thresholds=RED_IF_ANY, cell="color-text", w=8),
        g.table("Remapped rows (GPU × type)", "Row remapping: 'pending' needs a GPU reset, 'failure' means "
                "the GPU is out of spare rows (alerts SpxGpuRowRemapPending / SpxGpuRowRemapFailure).",
                [g.query(f"max by (gpu, type) (spx_gpu_remapped_rows{{{GPU}}})", table=True)],
                transformations=g.matrix("gpu", "type"), cell="color-text", w=8),
        g.timeseries("ECC error rate", "ECC errors per second by GPU and type.",
                     [g.query(f"sum by (gpu, type) (rate(spx_gpu_ecc_errors_total{{{GPU}}}[$__rate_interval]))",
                              "GPU {{gpu}} {{type}}")], unit="cps", min_=0, w=8),
    ]


def processes() -> list[g.Panel]:
    columns = {"A": "Memory used"}
    return [
        g.row("Processes"),
        g.table("Compute processes", "Processes with a CUDA context on each GPU and the job they belong to.",
                [g.query(f"max by (gpu, pid, spx_job) (spx_gpu_process_memory_used_bytes{{{GPU}}})", table=True)],
                transformations=g.merged(columns, [], ["gpu", "pid", "spx_job", "Memory used"]),
                overrides=[g.unit_override("Memory used", "bytes")], no_value="No compute processes", h=7),
        g.timeseries("Standby launchers' memory", "Host memory held by the jobs' standbys: each torchrun/DeepSpeed "
                     "job's next launcher, started ahead with torch imported (config launch_standby; "
                     "`spx status NAME` shows each job's). launch_standby: false gives it back; relaunches then "
                     "start cold.",
                     [g.query(f"max by (instance) (spx_standby_memory_bytes{{{HOST}}})", "{{instance}}")],
                     unit="bytes", min_=0, w=24, h=6),
    ]


def exporter() -> list[g.Panel]:
    return [
        g.row("Exporter"),
        g.stat("Daemon version", "spx-trainer version on this host.",
               [g.query(f"max by (version) (spx_build_info{{{HOST}}})", "{{version}}")], w=4, text_mode="name"),
        g.stat("Scrape target", "Prometheus' own view of the target (alert SpxDaemonDown).",
               [g.query(f'max(up{{job="spx-trainer", {HOST}}})')], w=4, mappings=UP_DOWN,
               thresholds=g.steps(("red", None), ("green", 1))),
        g.timeseries("Collector success", "1 when a collector's last run succeeded (alert SpxCollectorFailing).",
                     [g.query(f"max by (collector) (spx_scrape_success{{{HOST}}})", "{{collector}}")],
                     min_=0, max_=1, w=8),
        g.timeseries("Scrape duration", "Time the daemon spent building /metrics.",
                     [g.query(f"max without (job) (spx_scrape_duration_seconds{{{HOST}}})")], unit="s", min_=0, w=8),
        g.timeseries("NVML errors", "NVML calls that failed, per second, by function.",
                     [g.query(f"sum by (function) (rate(spx_nvml_errors_total{{{HOST}}}[$__rate_interval]))",
                              "{{function}}")], unit="cps", min_=0, w=24),
    ]


def build() -> dict:
    return g.dashboard(
        "spx-host-gpus", "spx-trainer / Host GPUs",
        "Per-GPU utilization, memory, power, temperature, clocks, throttle reasons, errors and the spx job "
        "on each GPU, and where the host's GPU time went (goodput, badput by cause), for one host.",
        tags=[TAG, "gpu"], variables=standard_variables(),
        panels=[*overview(), *gpu_table(), *utilization(), *power_thermal(), *clocks(), *pcie(), *errors(),
                *processes(), *goodput(), *exporter()],
        links=g.dashboard_links(TAG),
    )
