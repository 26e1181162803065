"""One scrape of one GPU, summarised for the GPU's recent readings (gpu/recent.py): the numbers an
incident shows for the minute before a failure, taken from the samples the collector just read —
no NVML call of its own.

Kept: utilization (GPU, memory), memory used, power and its limit, temperature (GPU, memory), SM and
memory clocks, each active clock-event (throttle) reason as `throttle_<reason>`, ECC counts
(corrected, uncorrected), remapped rows, and the NVLink error counters summed over links by type
(`nvlink_<type>_errors`); `up` 0 for a GPU that answered lost.
"""

from __future__ import annotations

_SCALARS = {
    "spx_gpu_utilization_ratio": "utilization",
    "spx_gpu_memory_utilization_ratio": "memory_utilization",
    "spx_gpu_memory_used_bytes": "memory_used_bytes",
    "spx_gpu_power_watts": "power_watts",
    "spx_gpu_power_limit_watts": "power_limit_watts",
    "spx_gpu_temperature_celsius": "temperature_celsius",
    "spx_gpu_memory_temperature_celsius": "memory_temperature_celsius",
    "spx_gpu_sm_clock_hertz": "sm_clock_hertz",
    "spx_gpu_memory_clock_hertz": "memory_clock_hertz",
}


def summary(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, float]:
    """The reading of one GPU from its scrape's samples (name, labels, value)."""
    out: dict[str, float] = {"up": 1.0}
    for name, labels, value in samples:
        if name in _SCALARS:
            out[_SCALARS[name]] = value
        elif name == "spx_gpu_clocks_event_active" and value:
            out[f"throttle_{labels.get('reason', 'unknown')}"] = 1.0
        elif name == "spx_gpu_ecc_errors_total":
            out[f"ecc_{labels.get('type', 'unknown')}"] = value
        elif name == "spx_gpu_remapped_rows":
            out[f"remapped_rows_{labels.get('type', 'unknown')}"] = value
        elif name == "spx_gpu_nvlink_errors_total":
            key = f"nvlink_{labels.get('type', 'unknown')}_errors"
            out[key] = out.get(key, 0.0) + value
    return out


LOST = {"up": 0.0}
