"""What the three dashboards share: template variables, label selectors, colours.

Label model (see docs/dashboards.md): the scrape config uses `honor_labels: true`, so a per-GPU series
carries `job="<spx job>"` while the GPU is allocated and the scrape job's `job="spx-trainer"` while
it is idle. Panels therefore never print the raw `job` label of a GPU series: per-GPU panels aggregate
it away (`max by (gpu)`), and attribution comes from `instance_gpu:spx_gpu_job:info`, whose `job` label
exists only when a `spx_job_state` series for that job exists.
"""

from __future__ import annotations

from . import grafana as g

TAG = "spx-trainer"

# Selectors with the template variables in them; every panel filters through one of these.
HOST = 'instance=~"$instance"'
GPU = f'{HOST}, gpu=~"$gpu"'
JOB = f'{HOST}, job=~"$job"'
LINK = f'{GPU}, link=~"$link"'

# Rows of the GPU × link matrix in link order (H100 SXM has 18; more links still show, unordered).
NVLINK_COLUMNS = [str(i) for i in range(18)]

UP_DOWN = g.value_map({"1": ("up", "green"), "0": ("down", "red")})
ACTIVE = g.value_map({"1": ("active", "orange"), "0": ("-", "transparent")})

JOB_STATES = ["queued", "starting", "running", "restarting", "succeeded", "failed", "cancelled"]
JOB_STATE_COLOURS = ["text", "blue", "green", "orange", "dark-green", "red", "purple"]
# instance_job:spx_job_state:code numbers the states 1..7 in JOB_STATES order (recording rules).
JOB_STATE_CODES = g.value_map({str(i + 1): (s, c) for i, (s, c) in enumerate(zip(JOB_STATES, JOB_STATE_COLOURS, strict=True))})


def instance_variable(multi: bool = False) -> dict:
    # spx_build_info exists on every daemon, with or without GPUs.
    return g.query_variable("instance", "Host", "label_values(spx_build_info, instance)",
                            multi=multi, include_all=multi, all_value=".*" if multi else None)


def job_variable() -> dict:
    # spx_job_state exists only for real spx jobs, never for the scrape job's "spx-trainer".
    # "All" is ".*" so that idle GPUs (job="spx-trainer") stay selected.
    return g.query_variable("job", "Job", 'label_values(spx_job_state{instance=~"$instance"}, job)',
                            multi=True, include_all=True, all_value=".*")


def gpu_variable() -> dict:
    # Filtered by $job: picking a job narrows the GPUs to the ones it holds.
    return g.query_variable("gpu", "GPU",
                            'label_values(spx_gpu_info{instance=~"$instance", job=~"$job"}, gpu)',
                            multi=True, include_all=True, numeric_sort=True)


def link_variable() -> dict:
    return g.query_variable("link", "NVLink",
                            'label_values(spx_gpu_nvlink_up{instance=~"$instance", gpu=~"$gpu"}, link)',
                            multi=True, include_all=True, all_value=".*", numeric_sort=True)


def standard_variables(multi_instance: bool = False) -> list[dict]:
    return [g.datasource_variable(), instance_variable(multi_instance), job_variable(), gpu_variable()]
