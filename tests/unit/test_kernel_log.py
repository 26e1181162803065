"""gpu/kernel_log.py: the kernel's health lines about a job's GPUs, read from a file in /dev/kmsg's
record format (what the daemon reads as root), kept by PCI address and time window, bounded."""

from __future__ import annotations

from spx.daemon.gpu import kernel_log as K

OFFSET = 1_700_000_000.0  # wall − monotonic of the scripted host: boot at this Unix time


def record(monotonic: float, text: str, seq: int = 1) -> str:
    return f"4,{seq},{int(monotonic * 1e6)},-;{text}\n"


def kmsg(tmp_path, *records: str):
    path = tmp_path / "kmsg"
    path.write_text("".join(records))
    return str(path)


def test_nvml_bus_ids_are_written_as_the_driver_writes_them():
    assert K.kernel_address("00000000:18:00.0") == "0000:18:00"
    assert K.kernel_address("0000:9A:00.0") == "0000:9a:00"
    assert K.kernel_address("not a bus id") is None


def test_only_health_lines_of_the_gpus_asked_within_the_window_are_kept(tmp_path):
    path = kmsg(
        tmp_path,
        record(100.0, "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus."),
        " SUBSYSTEM=pci\n",  # a continuation line of the record above
        record(101.0, "NVRM: Xid (PCI:0000:2a:00): 13, Graphics Exception on GPC 0"),  # another GPU
        record(5.0, "NVRM: Xid (PCI:0000:18:00): 48, An uncorrectable double bit error (DBE)"),  # before the window
        record(102.0, "NVRM: GPU at PCI:0000:18:00: GPU-1234abcd"),  # about the GPU, not its health
        record(103.0, "e1000e: eth0 NIC Link is Up"),
        record(104.0, "NVRM: Xid (PCI:0000:18:00): 94, Contained ECC error"),
    )
    got = K.gpu_lines({"0000:18:00"}, OFFSET + 90, OFFSET + 110, path, wall_minus_monotonic=OFFSET)
    assert got.lines == {"0000:18:00": [
        "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:18:00): 94, Contained ECC error"]}
    assert got.unavailable is None and not got.truncated


def test_lines_per_gpu_and_their_length_are_bounded(tmp_path):
    long = "NVRM: Xid (PCI:0000:18:00): 31, " + "x" * 1000
    path = kmsg(tmp_path, *(record(100.0 + i * 0.01, long, i) for i in range(K.MAX_LINES + 5)))
    got = K.gpu_lines({"0000:18:00"}, OFFSET, OFFSET + 200, path, wall_minus_monotonic=OFFSET)
    kept = got.lines["0000:18:00"]
    assert len(kept) == K.MAX_LINES and all(len(line) == K.MAX_LINE_CHARS for line in kept) and got.truncated


def test_an_unreadable_kernel_log_is_said_not_raised(tmp_path):
    got = K.gpu_lines({"0000:18:00"}, 0, 1, str(tmp_path / "missing"))
    assert got.lines == {"0000:18:00": []} and "No such file" in (got.unavailable or "")


def test_the_fakes_xids_are_written_to_its_fixtures_kernel_log_and_read_back(tmp_path):
    """The fake backend stands in for the driver here too: with `kernel_log` in its fixture, each XID
    it raises is written there as NVRM writes it, and the reader finds it by the GPU's PCI address."""
    import json
    import time

    import pynvml

    from spx.daemon.gpu.fake import DEFAULT_FIXTURE, FakeNvml

    fixture = json.loads(DEFAULT_FIXTURE.read_text())
    for dev in fixture["devices"]:
        dev["xid_schedule"] = []
    fixture["kernel_log"] = str(tmp_path / "kmsg")
    fake = FakeNvml(fixture)
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(2)
    events = fake.nvmlEventSetCreate()
    fake.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, events)
    fake.inject_xid(2, 79)
    assert fake.nvmlEventSetWait_v2(events, 0).eventData == 79
    bus_id = fake.nvmlDeviceGetPciInfo(handle).busId
    address = K.kernel_address(bus_id.decode() if isinstance(bus_id, bytes) else bus_id)
    got = K.gpu_lines({address}, time.time() - 5, time.time() + 5, fixture["kernel_log"])
    assert got.lines == {address: [f"NVRM: Xid (PCI:{address}): 79, pid='<unknown>', name=<unknown>, "
                                   "simulated by the fake fixture"]}
