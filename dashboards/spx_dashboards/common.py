"""What the three dashboards share: template variables, label selectors, colours.

Label model (see docs/dashboards.md): the exporter names the spx job in `spx_job`, never in `job`,
which stays the scrape job's (`job="spx-trainer"` on every series, as Prometheus sets it). A per-GPU
series carries `spx_job` only while a job holds the GPU; an idle GPU has none. Per-GPU panels
aggregate it away (`max by (gpu)`), so a GPU that moves between jobs stays one line.
"""

from __future__ import annotations

from . import grafana as g

TAG = "spx-trainer"

# Selectors with the template variables in them; every panel filters through one of these.
HOST = 'instance=~"$instance"'
GPU = f'{HOST}, gpu=~"$gpu"'
JOB = f'{HOST}, spx_job=~"$spx_job"'
LINK = f'{GPU}, link=~"$link"'

# Rows of the GPU × link matrix in link order (H100 SXM has 18; more links still show, unordered).
NVLINK_COLUMNS = [str(i) for i in range(18)]

UP_DOWN = g.value_map({"1": ("up", "green"), "0": ("down", "red")})
ACTIVE = g.value_map({"1": ("active", "orange"), "0": ("-", "transparent")})

JOB_STATES = ["queued", "starting", "running", "restarting", "succeeded", "failed", "cancelled"]
JOB_STATE_COLOURS = ["text", "blue", "green", "orange", "dark-green", "red", "purple"]
# instance_spx_job:spx_job_state:code numbers the states 1..7 in JOB_STATES order (recording rules).
JOB_STATE_CODES = g.value_map({str(i + 1): (s, c) for i, (s, c) in enumerate(zip(JOB_STATES, JOB_STATE_COLOURS, strict=True))})


def instance_variable(multi: bool = False) -> dict:
    # spx_build_info exists on every daemon, with or without GPUs.
    return g.query_variable("instance", "Host", "label_values(spx_build_info, instance)",
                            multi=multi, include_all=multi, all_value=".*" if multi else None)


def job_variable() -> dict:
    # "All" is ".*", which also matches a series without the label, so idle GPUs stay selected.
    return g.query_variable("spx_job", "Job", 'label_values(spx_job_state{instance=~"$instance"}, spx_job)',
                            multi=True, include_all=True, all_value=".*")


def gpu_variable() -> dict:
    # Filtered by $spx_job: picking a job narrows the GPUs to the ones it holds.
    return g.query_variable("gpu", "GPU",
                            'label_values(spx_gpu_info{instance=~"$instance", spx_job=~"$spx_job"}, gpu)',
                            multi=True, include_all=True, numeric_sort=True)


def link_variable() -> dict:
    return g.query_variable("link", "NVLink",
                            'label_values(spx_gpu_nvlink_up{instance=~"$instance", gpu=~"$gpu"}, link)',
                            multi=True, include_all=True, all_value=".*", numeric_sort=True)


def standard_variables(multi_instance: bool = False) -> list[dict]:
    return [g.datasource_variable(), instance_variable(multi_instance), job_variable(), gpu_variable()]
