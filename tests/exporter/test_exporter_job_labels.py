"""The job labels: `spx_job` names the job (never `job`, which is Prometheus' target label) and
`spx_job_info` its owner; `metrics_job_labels: false` leaves no job or owner name anywhere in the
scrape (any local user can read /metrics), GPU series unchanged apart from the label. The same fake
host and real worker as the golden test."""

from __future__ import annotations

from exporter_support import ManualClock, job_view
from metrics_text import samples, scrape
from prometheus_client.parser import text_string_to_metric_families

from harness import wait_for
from spx.daemon.core.config import DaemonConfig, load_config
from spx.daemon.exporter.job_collector import JOB_FAMILIES
from spx.daemon.exporter.server import build_registry

SECRET = "alice-secret-project"
OWNER = "alice"  # job_view's owner


def _scrape(make_backend, worker, job_labels: bool) -> str:
    backend = make_backend(clock=ManualClock(), only_pids=[worker.pid])
    registry = build_registry(backend, lambda: [job_view(name=SECRET, pids=[worker.pid])], "0.1.0",
                              job_labels=job_labels)
    wait_for(lambda: backend.compute_pids(0) == [worker.pid], 10, "the worker on fake GPU 0")
    return scrape(registry)


def test_job_names_are_shown_by_default(make_backend, worker):
    text = _scrape(make_backend, worker, job_labels=True)
    assert DaemonConfig().metrics_job_labels is True
    assert [lab["gpu"] for lab, _ in samples(text, "spx_gpu_up") if lab.get("spx_job") == SECRET] == ["0", "1"]
    assert samples(text, "spx_gpu_process_memory_used_bytes")[0][0]["spx_job"] == SECRET
    assert samples(text, "spx_job_step") == [({"spx_job": SECRET}, 1200.0)]
    assert samples(text, "spx_job_info") == [({"spx_job": SECRET, "owner": OWNER}, 1.0)]


def test_the_exporter_never_sets_prometheus_target_labels(make_backend, worker):
    """`job` and `instance` are the scrape target's (Prometheus sets them on every series): a scrape
    config without honor_labels keeps them, and nothing of ours is renamed to exported_job."""
    text = _scrape(make_backend, worker, job_labels=True)
    labels = {k for family in text_string_to_metric_families(text) for s in family.samples for k in s.labels}
    assert "spx_job" in labels and "owner" in labels
    assert not labels & {"job", "instance"}


def test_job_labels_off_leaves_no_job_name_in_the_scrape(make_backend, worker):
    with_names = _scrape(make_backend, worker, job_labels=True)
    text = _scrape(make_backend, worker, job_labels=False)
    assert SECRET not in text and 'spx_job="' not in text
    assert OWNER not in text and 'owner="' not in text
    for family in JOB_FAMILIES:
        assert not samples(text, family)
    assert {lab["collector"] for lab, _ in samples(text, "spx_scrape_success")} == {"gpu"}
    # GPU series are all still there, only without the label.
    for name in ("spx_gpu_up", "spx_gpu_memory_used_bytes", "spx_gpu_process_memory_used_bytes", "spx_gpu_nvlink_up"):
        assert _without_job(text, name) == _without_job(with_names, name) != []


def _without_job(text: str, name: str) -> list:
    return sorted((sorted((k, v) for k, v in lab.items() if k != "spx_job"), val) for lab, val in samples(text, name))


def test_config_option_is_read_from_the_config_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("metrics_job_labels: false\n")
    assert load_config(path, root=tmp_path).metrics_job_labels is False
