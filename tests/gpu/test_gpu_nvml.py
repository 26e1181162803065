"""The daemon's NVML backend and exporter on the real driver: every GPU found, one scrape that
agrees with NVML, NVLink links as the GPU reports them, no recurring NVML errors, a scrape that
promtool accepts, and a bounded number of NVML calls per GPU whatever the link count.

    bash tests/run.sh tests/gpu -rs
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
from gpu_support import CountingNvml, error_counts, nvidia_smi_uuids, nvlink_states, text_of
from metrics_text import samples, scrape, value

from spx.daemon.exporter.gpu_collector import CALLS_PER_GPU
from spx.daemon.exporter.server import build_registry
from spx.daemon.gpu.backend import GpuBackend

# Per GPU and scrape beyond CALLS_PER_GPU: nvmlDeviceGetPowerUsage and nvmlDeviceGetEnforcedPowerLimit,
# the collector's fallbacks on drivers without the power field ids.
POWER_FALLBACKS = 2


def test_open_backend_nvml_finds_every_gpu_nvml_counts_with_its_uuid(nvml_backend, nvml):
    devices = nvml_backend.devices()
    assert nvml_backend.kind == "nvml" and nvml_backend.driver_version
    assert [d.index for d in devices] == list(range(nvml.nvmlDeviceGetCount()))
    for d in devices:
        handle = nvml.nvmlDeviceGetHandleByIndex(d.index)
        assert d.uuid == text_of(nvml.nvmlDeviceGetUUID(handle))
        assert d.memory_total_bytes == nvml.nvmlDeviceGetMemoryInfo(handle).total
    assert f"{len(devices)}×" in nvml_backend.description


def test_open_backend_nvml_finds_every_gpu_nvidia_smi_lists(nvml_backend):
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not on PATH: the NVML-only identity test covers this host")
    assert [d.uuid for d in nvml_backend.devices()] == nvidia_smi_uuids(smi), "GPU UUIDs by index differ from nvidia-smi -L"


def test_one_scrape_has_every_gpu_up_with_the_values_nvml_reports(nvml_backend, nvml):
    text = scrape(build_registry(nvml_backend, lambda: [], "t"))
    assert value(text, "spx_gpu_backend_info", kind="nvml") == 1
    for d in nvml_backend.devices():
        gpu = {"gpu": str(d.index), "uuid": d.uuid}
        assert value(text, "spx_gpu_up", **gpu) == 1, f"GPU {d.index} is down in the scrape"
        info = [lab for lab, _ in samples(text, "spx_gpu_info") if lab.get("gpu") == str(d.index)]
        assert info and info[0]["name"] == d.name and info[0]["driver"] == nvml_backend.driver_version
        handle = nvml.nvmlDeviceGetHandleByIndex(d.index)
        assert value(text, "spx_gpu_memory_total_bytes", **gpu) == nvml.nvmlDeviceGetMemoryInfo(handle).total
        util = value(text, "spx_gpu_utilization_ratio", **gpu)
        assert util is not None and 0.0 <= util <= 1.0, f"GPU {d.index}: utilization {util}"
        power = value(text, "spx_gpu_power_watts", **gpu)
        assert power is not None and 0.0 < power < 5000.0, f"GPU {d.index}: power {power} W"
        temp = value(text, "spx_gpu_temperature_celsius", **gpu)
        assert temp is not None and 0.0 < temp < 130.0, f"GPU {d.index}: temperature {temp} °C"
        used = value(text, "spx_gpu_memory_used_bytes", **gpu)
        assert used is not None and 0 <= used <= d.memory_total_bytes


def test_nvlink_up_samples_exactly_for_the_links_each_gpu_reports(nvml_backend, nvml):
    """An SXM GPU exports one `spx_gpu_nvlink_up` per link (e.g. 18 on H100/H200), a PCIe GPU
    without NVLink none; the links and their states agree with NVML's per-link API."""
    text = scrape(build_registry(nvml_backend, lambda: [], "t"))
    for d in nvml_backend.devices():
        states = nvlink_states(nvml, nvml.nvmlDeviceGetHandleByIndex(d.index))
        exported = {int(lab["link"]): v for lab, v in samples(text, "spx_gpu_nvlink_up") if lab["gpu"] == str(d.index)}
        assert sorted(exported) == sorted(states), (
            f"GPU {d.index} ({d.name}): NVML reports links {sorted(states)}, the scrape has {sorted(exported)}")
        expected = {link: 1.0 if s == nvml.NVML_FEATURE_ENABLED else 0.0 for link, s in states.items()}
        assert exported == expected, (
            f"GPU {d.index}: nvlink_up {exported} vs nvmlDeviceGetNvLinkState {states} (1 = active; a link in "
            "low-power sleep counts as up in the exporter)")
        if states:  # the link counters ride in the same field-values call
            tx = [lab for lab, _ in samples(text, "spx_gpu_nvlink_transmit_bytes_total") if lab["gpu"] == str(d.index)]
            assert tx, f"GPU {d.index} has NVLink links but no spx_gpu_nvlink_transmit_bytes_total"


def test_no_nvml_error_recurs_from_one_scrape_to_the_next(nvml_backend):
    """NOT_SUPPORTED is remembered, never counted; anything else that fails counts on every
    scrape. After the first scrape (which also learns capabilities) the counts must stand still."""
    registry = build_registry(nvml_backend, lambda: [], "t")
    scrape(registry)
    second = scrape(registry)
    third = scrape(registry)
    before, after = error_counts(second), error_counts(third)
    grew = {f: (before.get(f, 0), n) for f, n in after.items() if n > before.get(f, 0)}
    assert not grew, f"NVML calls failing on every scrape (function: (before, after)): {grew}"
    assert value(third, "spx_scrape_success", collector="gpu") == 1, f"gpu collector reports a failed read: {after}"
    assert value(third, "spx_xid_watch_up") is not None


def test_promtool_check_metrics_finds_no_problem_in_a_real_scrape(nvml_backend):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not on PATH (Debian: apt-get install prometheus)")
    text = scrape(build_registry(nvml_backend, lambda: [], "t"))
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), f"promtool: {res.stdout}{res.stderr}"


def test_nvml_calls_per_gpu_and_scrape_are_bounded_and_never_per_link(nvml):
    counting = CountingNvml(nvml)
    counting.nvmlInit()  # the backend's close() shuts this session down
    backend = GpuBackend("nvml", "counting proxy over pynvml", counting, nvml.nvmlSystemGetDriverVersion())
    try:
        registry = build_registry(backend, lambda: [], "t")
        scrape(registry)  # the first scrape also asks each GPU for its link count, once
        counting.calls.clear()
        scrape(registry)
        handles = [backend.handle(d.index) for d in backend.devices()]
        per_gpu = counting.per_gpu(handles)
        links = [len(nvlink_states(nvml, h)) for h in handles]
    finally:
        backend.close()
    bound = len(CALLS_PER_GPU) + POWER_FALLBACKS
    for index, calls in enumerate(per_gpu):
        total = sum(calls.values())
        assert 0 < total <= bound, f"GPU {index} ({links[index]} NVLink links): {total} NVML calls > {bound}: {calls}"
        assert calls.get("nvmlDeviceGetFieldValues", 0) <= 1, f"GPU {index}: more than one field-values call: {calls}"
        per_link = sorted(f for f in calls if "NvLink" in f)
        assert not per_link, f"GPU {index}: per-link NVML calls in a scrape: {per_link}"
    # GPUs with different link counts (an NVLink GPU next to a PCIe one) make the same calls.
    totals = [sum(c.values()) for c in per_gpu]
    assert max(totals) - min(totals) <= POWER_FALLBACKS, f"calls per GPU {totals} for NVLink links {links}"
