"""The GPU health gate (gpu/health.py) against the fake NVML: a GPU passes, or fails with one line
that says why. Between two checks the host changes: the gate is pointed at a second fake whose
fixture has the fault (the same GPU, one check later)."""

from __future__ import annotations

import copy
import json

import pytest

from spx.daemon.gpu.backend import fake_backend
from spx.daemon.gpu.fake import DEFAULT_FIXTURE, FakeNvml
from spx.daemon.gpu.health import HealthGate, fatal_xid, xid_reason

BASE = json.loads(DEFAULT_FIXTURE.read_text())


def backend_with(change=None):
    fixture = copy.deepcopy(BASE)
    if change:
        change(fixture["devices"][2])
    return fake_backend(FakeNvml(fixture))


@pytest.fixture
def backends():
    opened = []

    def make(change=None):
        b = backend_with(change)
        opened.append(b)
        return b

    yield make
    for b in opened:
        b.close()


def test_a_healthy_host_passes_and_faults_present_before_the_first_check_are_the_baseline(backends):
    gate = HealthGate(backends())
    # GPU 3 of the fixture has NVLink link 7 down and corrected ECC errors: the host's, not news.
    assert [gate.check(g) for g in range(8)] == [None] * 8
    assert [gate.check(g) for g in range(8)] == [None] * 8


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d.__setitem__("ecc_uncorrected", 2), "uncorrectable ECC errors on GPU 2 rose from 0 to 2"),
    (lambda d: d.__setitem__("nvlink_down", [4, 5]), "NVLink links 4, 5 of GPU 2 went down"),
    (lambda d: d.__setitem__("remapped_rows", {"correctable": 0, "uncorrectable": 1, "pending": 1, "failure": 0}),
     "row remap pending on GPU 2 (needs a reset)"),
    (lambda d: d.__setitem__("remapped_rows", {"correctable": 0, "uncorrectable": 1, "pending": 0, "failure": 1}),
     "row remapping failed on GPU 2"),
])
def test_a_gpu_that_changed_for_the_worse_since_the_last_check_fails(backends, change, expected):
    gate = HealthGate(backends())
    assert gate.check(2) is None
    gate.backend = backends(change)
    assert gate.check(2) == expected
    assert gate.check(1) is None


def test_a_lost_gpu_fails_at_once(backends):
    b = backends()
    gate = HealthGate(b)
    b.nvml.fail_gpu(5)
    assert gate.check(5) == "GPU 5 lost: NVML says GPU is lost"


def test_fatal_xids_are_the_ones_that_make_a_gpu_unusable():
    assert fatal_xid(79) == "GPU fell off the bus" and fatal_xid(13) is None and fatal_xid(31) is None
    assert xid_reason(3, 79) == "XID 79 on GPU 3 (GPU fell off the bus)"


def test_an_nvml_error_that_is_not_a_lost_gpu_condemns_nothing(backends):
    b = backends()
    gate = HealthGate(b)
    b.nvml.fail_function("nvmlDeviceGetMemoryInfo", 4, b.nvml.NVML_ERROR_TIMEOUT)
    assert gate.check(4) is None
