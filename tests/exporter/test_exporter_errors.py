"""A GPU or a read that errors: `spx_gpu_up 0` / an absent sample, never a stale value; the scrape answers."""

from __future__ import annotations

import urllib.request

import pynvml
from exporter_support import job_view
from metrics_text import samples, scrape, value

from spx.daemon.exporter.server import build_registry, serve


def gpu_samples(text: str, gpu: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        if not line.startswith("#") and f'gpu="{gpu}"' in line:
            names.add(line.split("{", 1)[0])
    return names


def test_lost_gpu_reports_up_0_and_no_stale_values(make_backend):
    backend = make_backend()
    registry = build_registry(backend, lambda: [job_view()], "t")
    before = scrape(registry)
    assert value(before, "spx_gpu_up", gpu="5") == 1
    assert value(before, "spx_gpu_power_watts", gpu="5") is not None

    backend.nvml.fail_gpu(5)
    after = scrape(registry)
    assert value(after, "spx_gpu_up", gpu="5") == 0
    # Identity and the daemon's own XID event counts stay; every reading of the GPU is gone.
    assert gpu_samples(after, "5") == {"spx_gpu_up", "spx_gpu_info", "spx_gpu_xid_errors_total"}
    assert value(after, "spx_scrape_success", collector="gpu") == 0
    assert all(value(after, "spx_gpu_up", gpu=str(i)) == 1 for i in range(8) if i != 5)
    assert len(samples(after, "spx_gpu_nvlink_up")) == 7 * 18
    assert not backend.healthy(5) and backend.healthy(4)
    assert backend.compute_pids(5) is None

    backend.nvml.restore()
    assert value(scrape(registry), "spx_gpu_up", gpu="5") == 1


def test_lost_gpu_scrape_still_answers_over_http(make_backend):
    backend = make_backend()
    backend.nvml.fail_gpu(0)
    server = serve(build_registry(backend, lambda: [], "t"), "127.0.0.1:0")
    try:
        with urllib.request.urlopen(server.url, timeout=30) as resp:
            assert resp.status == 200
            text = resp.read().decode()
    finally:
        server.shutdown()
    assert value(text, "spx_gpu_up", gpu="0") == 0
    assert value(text, "spx_gpu_up", gpu="1") == 1


def test_one_failing_read_drops_that_sample_and_counts_the_error(make_backend):
    backend = make_backend()
    registry = build_registry(backend, lambda: [], "t")
    backend.nvml.fail_function("nvmlDeviceGetTemperature", index=2, code=pynvml.NVML_ERROR_UNKNOWN)
    first = scrape(registry)
    assert value(first, "spx_gpu_up", gpu="2") == 1
    assert value(first, "spx_gpu_temperature_celsius", gpu="2") is None
    assert value(first, "spx_gpu_temperature_celsius", gpu="3") is not None
    assert value(first, "spx_nvml_errors_total", function="nvmlDeviceGetTemperature") == 1
    second = scrape(registry)
    assert value(second, "spx_nvml_errors_total", function="nvmlDeviceGetTemperature") == 2  # a real counter


def test_not_supported_is_absent_not_an_error(make_backend):
    backend = make_backend()
    registry = build_registry(backend, lambda: [], "t")
    backend.nvml.fail_function("nvmlDeviceGetPcieThroughput", code=pynvml.NVML_ERROR_NOT_SUPPORTED)
    text = scrape(registry)
    assert samples(text, "spx_gpu_pcie_transmit_bytes_per_second") == []
    assert samples(text, "spx_nvml_errors_total") == []
    assert value(text, "spx_scrape_success", collector="gpu") == 1


def test_failing_jobs_source_keeps_gpu_metrics(make_backend):
    def broken():
        raise RuntimeError("store unavailable")

    registry = build_registry(make_backend(), broken, "t")
    text = scrape(registry)
    assert len(samples(text, "spx_gpu_up")) == 8
    assert all("spx_job" not in labels for labels, _ in samples(text, "spx_gpu_up"))
    assert value(text, "spx_scrape_success", collector="job") == 0
    assert value(text, "spx_build_info", version="t") == 1


def test_job_label_only_on_allocated_states(make_backend):
    views = [job_view("a", "running", [0, 1]), job_view("b", "queued", [2]), job_view("c", "succeeded", [3])]
    text = scrape(build_registry(make_backend(), lambda: views, "t"))
    jobs = {labels["gpu"]: labels.get("spx_job") for labels, _ in samples(text, "spx_gpu_up")}
    assert jobs == {"0": "a", "1": "a", "2": None, "3": None, "4": None, "5": None, "6": None, "7": None}
    assert value(text, "spx_job_state", spx_job="c", state="succeeded") == 1
    assert value(text, "spx_job_gpus", spx_job="a") == 2


def test_a_failed_link_count_read_drops_the_links_for_that_scrape_only(make_backend):
    backend = make_backend()
    registry = build_registry(backend, lambda: [], "t")
    backend.nvml.fail_function("nvmlDeviceGetFieldValues", index=2)
    first = scrape(registry)
    assert not [s for s in samples(first, "spx_gpu_nvlink_up") if s[0]["gpu"] == "2"]
    assert value(first, "spx_scrape_success", collector="gpu") == 0
    backend.nvml.restore()
    second = scrape(registry)
    assert len([s for s in samples(second, "spx_gpu_nvlink_up") if s[0]["gpu"] == "2"]) == 18
    assert value(second, "spx_scrape_success", collector="gpu") == 1


def test_fields_the_gpu_never_has_are_asked_once(make_backend):
    """H100s answer the per-link error fields, not the ≤12-link legacy ids (NOT_SUPPORTED): those
    leave the request after the first scrape, and the samples stay the same."""
    backend = make_backend()
    registry = build_registry(backend, lambda: [], "t")
    asked: list[int] = []
    real = backend.nvml.nvmlDeviceGetFieldValues

    def counting(handle, ids):
        asked.append(len(ids))
        return real(handle, ids)

    backend.nvml.nvmlDeviceGetFieldValues = counting
    first, second = scrape(registry), scrape(registry)
    # First scrape: the link count, then the full request, per GPU; then only the narrowed request.
    full, narrowed = asked[1], asked[-1]
    assert narrowed < full and all(n == narrowed for n in asked[16:])

    def series(text: str) -> list[tuple[str, tuple]]:
        return sorted((name, tuple(sorted(labels.items())))
                      for name in ("spx_gpu_nvlink_errors_total", "spx_gpu_ecc_errors_total", "spx_gpu_power_watts")
                      for labels, _ in samples(text, name))

    assert series(first) == series(second)
