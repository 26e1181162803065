"""The device program's decisions, without a kernel: a small interpreter for the instructions it
uses runs it on every (device type, major, minor) that matters. The kernel's own verdict on the
same bytes is tests/integration/test_device_filter.py's."""

from __future__ import annotations

import json
import struct

import pytest

from spx.daemon.gpu.backend import fake_backend
from spx.daemon.gpu.fake import DEFAULT_FIXTURE, FakeNvml
from spx.daemon.run import device_filter
from spx.daemon.run.device_filter import DeviceFilters, program

BLOCK, CHAR = 1, 2
ACC_MKNOD, ACC_READ, ACC_WRITE = 1, 2, 4


def run(code: bytes, dev_type: int, major: int, minor: int, access: int = ACC_READ | ACC_WRITE) -> int:
    """Execute the program on a `struct bpf_cgroup_dev_ctx`; its r0 (1 allows, 0 denies)."""
    ctx = struct.pack("<III", (access << 16) | dev_type, major, minor)
    insns = [struct.unpack_from("<BBhi", code, at) for at in range(0, len(code), 8)]
    regs = [0] * 11
    pc, steps = 0, 0
    while True:
        assert 0 <= pc < len(insns), f"jumped out of the program to {pc}"
        steps += 1
        assert steps <= len(insns), "a loop: the verifier would refuse it"
        op, regs_byte, off, imm = insns[pc]
        dst, src = regs_byte & 0xF, regs_byte >> 4
        pc += 1
        if op == device_filter.LDX_W:
            assert src == 1 and off in (0, 4, 8), "reads only the context's three u32 fields"
            regs[dst] = struct.unpack_from("<I", ctx, off)[0]
        elif op == device_filter.AND32_K:
            regs[dst] = (regs[dst] & imm) & 0xFFFFFFFF
        elif op == device_filter.MOV64_K:
            regs[dst] = imm
        elif op in (device_filter.JNE_K, device_filter.JEQ_K, device_filter.JGT_K):
            taken = {device_filter.JNE_K: regs[dst] != imm, device_filter.JEQ_K: regs[dst] == imm,
                     device_filter.JGT_K: regs[dst] > imm}[op]
            pc += off if taken else 0
        elif op == device_filter.EXIT:
            return regs[0]
        else:
            raise AssertionError(f"unexpected opcode {op:#x}")


def allowed_gpu_minors(code: bytes) -> set[int]:
    return {m for m in range(256) if run(code, CHAR, 195, m) == 1}


def test_only_the_allocated_minors_of_nvidia_char_devices_are_allowed():
    code = program([1, 2])
    assert allowed_gpu_minors(code) == {1, 2, 254, 255}, "nvidia-modeset and nvidiactl stay allowed"
    for access in (ACC_MKNOD, ACC_READ, ACC_WRITE, ACC_READ | ACC_WRITE | ACC_MKNOD):
        assert run(code, CHAR, 195, 0, access) == 0 and run(code, CHAR, 195, 2, access) == 1


def test_everything_that_is_not_a_gpu_node_is_left_alone():
    code = program([])
    assert allowed_gpu_minors(code) == {254, 255}, "gpus: 0 opens no GPU"
    assert run(code, BLOCK, 195, 0) == 1, "a block device 195:0 is not a GPU"
    for major, minor in ((1, 3), (10, 200), (194, 0), (196, 0), (235, 0), (511, 0), (510, 1)):
        assert run(code, CHAR, major, minor) == 1, (major, minor)  # /dev/null, nvidia-uvm's dynamic majors, ...


def test_minors_outside_the_gpu_range_and_duplicates_change_nothing():
    assert program([254, 255, 300, -1]) == program([])
    assert program([3, 3, 1]) == program([1, 3])
    assert allowed_gpu_minors(program(range(254))) == set(range(256))


def test_the_largest_program_still_reaches_every_verdict():
    """254 allowed minors: every jump offset still lands inside the program."""
    code = program(range(0, 254, 2))
    assert allowed_gpu_minors(code) == set(range(0, 254, 2)) | {254, 255}


def test_a_gpu_opens_by_its_minor_and_one_without_a_minor_opens_nothing():
    findings: list[dict] = []
    filters = DeviceFilters({0: 0, 1: 6, 2: None}, "cgroups: off in the config", findings.append)
    assert filters.allowed([0, 1, 2, 9]) == [0, 6]
    assert filters.unavailable == "attempt cgroups are not managed (cgroups: off in the config)"
    assert findings == [{"enforced": False, "detail": filters.unavailable, "fix": device_filter.FIX_UNMANAGED}]


def test_unmanaged_cgroups_make_no_bpf_call(monkeypatch, tmp_path):
    def refuse(*_args):
        raise AssertionError("bpf(2) called")

    monkeypatch.setattr(device_filter, "_bpf", refuse)
    filters = DeviceFilters({0: 0}, "no cgroup v2", lambda finding: None)
    assert filters.confine(tmp_path, [0], "j", 1) is False
    assert filters.pending(tmp_path, "j", 1) is None


def test_a_record_that_cannot_be_written_is_logged_not_raised():
    def full(_finding):
        raise OSError(28, "No space left on device")

    assert DeviceFilters({}, "off", full).unavailable is not None


@pytest.mark.parametrize("minors, expected", [(None, list(range(8))), ({0: 3, 3: 0}, [3, 1, 2, 0, 4, 5, 6, 7])])
def test_the_gpu_backend_reports_each_gpus_minor(minors, expected):
    fixture = json.loads(DEFAULT_FIXTURE.read_text())
    for index, minor in (minors or {}).items():
        fixture["devices"][index]["minor"] = minor
    with fake_backend(FakeNvml(fixture)) as backend:
        assert [d.minor for d in backend.devices()] == expected
