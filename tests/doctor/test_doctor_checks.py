"""spx doctor's judgements, one check at a time, on fixture /proc and /sys trees and real dirs.

The only stand-ins are fixture files (cpuinfo, DMI, mountinfo, sysfs block trees) and alternative GPU
fixtures for the project's own fake NVML; every directory checked is a real one.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import pytest

from spx.daemon.doctor.hostprobe import mount_for, parse_mountinfo
from spx.daemon.doctor.report import (
    Check,
    DoctorContext,
    check_checkpoint_locks,
    check_checkpoints,
    check_host,
    check_spool,
    check_staging,
    check_state,
    check_unit,
    exit_code,
    gpu_checks,
    render_text,
    run_checks,
    to_json,
    unit_check,
)
from spx.daemon.doctor.worker_checks import check_worker, worker_check
from spx.daemon.gpu.backend import GpuBackend, open_backend
from spx.daemon.gpu.fake import DEFAULT_FIXTURE, FakeNvml

X86_FLAGS = "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sse sse2 ht syscall nx lm"


def make_proc(tmp: Path, *, hypervisor: bool | None, pid1: str = "systemd", mountinfo: str = "") -> Path:
    proc = tmp / "proc"
    (proc / "1").mkdir(parents=True)
    (proc / "self").mkdir()
    cpu = "processor\t: 0\nvendor_id\t: GenuineIntel\n"
    if hypervisor is not None:
        cpu += X86_FLAGS + (" hypervisor" if hypervisor else "") + "\n"
    (proc / "cpuinfo").write_text(cpu)
    (proc / "1" / "comm").write_text(pid1 + "\n")
    (proc / "self" / "mountinfo").write_text(mountinfo)
    return proc


def make_sys(tmp: Path, dmi: dict[str, str] | None = None) -> Path:
    sys_root = tmp / "sys"
    d = sys_root / "class" / "dmi" / "id"
    d.mkdir(parents=True)
    for k, v in (dmi or {}).items():
        (d / k).write_text(v + "\n")
    (sys_root / "block").mkdir()
    (sys_root / "dev" / "block").mkdir(parents=True)
    return sys_root


def add_disk(sys_root: Path, name: str, dev: str, *, rotational: int = 0, model: str = "",
             part: tuple[str, str] | None = None, slaves: tuple[str, ...] = ()) -> None:
    """A /sys/devices/... node for disk `name` (and partition `part`), linked from /sys/block and
    /sys/dev/block like the kernel does."""
    node = sys_root / "devices" / "pci0000:00" / name
    (node / "queue").mkdir(parents=True)
    (node / "queue" / "rotational").write_text(f"{rotational}\n")
    (node / "slaves").mkdir()
    if model:
        (node / "device").mkdir()
        (node / "device" / "model").write_text(model + "\n")
    for s in slaves:
        (node / "slaves" / s).symlink_to(os.path.relpath(sys_root / "devices" / "pci0000:00" / s, node / "slaves"))
    (sys_root / "block" / name).symlink_to(os.path.relpath(node, sys_root / "block"))
    (sys_root / "dev" / "block" / dev).symlink_to(os.path.relpath(node, sys_root / "dev" / "block"))
    if part:
        pname, pdev = part
        (node / pname).mkdir()
        (node / pname / "partition").write_text("1\n")
        (sys_root / "dev" / "block" / pdev).symlink_to(os.path.relpath(node / pname, sys_root / "dev" / "block"))


def line(mid: int, dev: str, mount_point: str, fstype: str, source: str, opts: str = "rw,relatime") -> str:
    mp = mount_point.replace(" ", "\\040")
    return f"{mid} 1 {dev} / {mp} {opts} shared:{mid} - {fstype} {source} rw\n"


ROOT_LINE = line(20, "254:0", "/", "ext4", "/dev/vda")


def ctx_for(tmp: Path, mountinfo: str, **kw) -> DoctorContext:
    proc = make_proc(tmp, hypervisor=False, mountinfo=mountinfo)
    sys_root = kw.pop("sys_root", None) or make_sys(tmp)
    return DoctorContext(proc_root=proc, sys_root=sys_root, detect_virt=None, **kw)


# --- host ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hypervisor", "dmi", "status", "words"),
    [
        (False, {"sys_vendor": "Supermicro", "product_name": "SYS-821GE-TNHR"}, "ok", "bare metal"),
        # A VM is a normal host: said, not judged.
        (True, {}, "ok", "virtual machine (hypervisor flag"),
        (False, {"sys_vendor": "QEMU", "product_name": "Standard PC (Q35 + ICH9, 2009)"}, "ok", "DMI: QEMU"),
        (None, {"sys_vendor": "Amazon EC2", "product_name": "p5.48xlarge"}, "ok", "virtual machine (DMI: Amazon EC2"),
        (False, {"sys_vendor": "Amazon EC2", "product_name": "m7i.metal-48xl.metal"}, "ok", "bare metal"),
        (None, {}, "ok", "no cpuinfo flags, DMI or systemd-detect-virt to tell"),
    ],
)
def test_host_bare_metal_or_vm(tmp_path: Path, hypervisor, dmi, status, words) -> None:
    ctx = DoctorContext(proc_root=make_proc(tmp_path, hypervisor=hypervisor), sys_root=make_sys(tmp_path, dmi),
                        detect_virt=None)
    c = check_host(ctx)
    assert (c.status, words in c.detail) == (status, True), c


# --- checkpoints ---------------------------------------------------------------------------------


def test_checkpoints_missing(tmp_path: Path) -> None:
    c = check_checkpoints(ctx_for(tmp_path, ROOT_LINE, checkpoints_root=tmp_path / "checkpoints"))
    assert c.status == "fail" and "does not exist" in c.detail and "persistent volume" in c.fix


def test_checkpoints_on_the_root_filesystem(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    c = check_checkpoints(ctx_for(tmp_path, ROOT_LINE, checkpoints_root=tmp_path / "checkpoints"))
    assert c.status == "fail" and "root filesystem" in c.detail and "ext4 /dev/vda" in c.detail


def test_checkpoints_on_a_separate_volume_are_ok(tmp_path: Path) -> None:
    ck = tmp_path / "my checkpoints"
    ck.mkdir()
    info = ROOT_LINE + line(40, "259:1", str(ck), "xfs", "/dev/nvme1n1")
    c = check_checkpoints(ctx_for(tmp_path, info, checkpoints_root=ck, checkpoint_min_free_bytes=1,
                                  checkpoint_fail_free_bytes=1))
    assert c.status == "ok", c
    assert "xfs /dev/nvme1n1" in c.detail and "writable" in c.detail and "free" in c.detail


def test_checkpoints_on_nfs_are_a_persistent_volume(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    info = ROOT_LINE + line(40, "0:52", str(ck), "nfs4", "fs.example:/vol/ck")
    c = check_checkpoints(ctx_for(tmp_path, info, checkpoints_root=ck, checkpoint_min_free_bytes=1,
                                  checkpoint_fail_free_bytes=1))
    assert c.status == "ok", c


@pytest.mark.parametrize(
    ("mount", "words"),
    [
        (("0:33", "tmpfs", "tmpfs", "rw"), "not persistent"),
        (("0:34", "overlay", "overlay", "rw"), "not persistent"),
        (("259:1", "ext4", "/dev/nvme1n1", "ro,relatime"), "read-only"),
        (("254:0", "ext4", "/dev/vda", "rw"), "bind mount of the root filesystem"),
    ],
)
def test_checkpoints_problems(tmp_path: Path, mount, words) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    dev, fstype, source, opts = mount
    c = check_checkpoints(ctx_for(tmp_path, ROOT_LINE + line(40, dev, str(ck), fstype, source, opts), checkpoints_root=ck))
    assert c.status == "fail" and words in c.detail, c


def test_checkpoints_low_free_space(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    info = ROOT_LINE + line(40, "259:1", str(ck), "ext4", "/dev/nvme1n1")
    c = check_checkpoints(ctx_for(tmp_path, info, checkpoints_root=ck, checkpoint_fail_free_bytes=1 << 60))
    assert c.status == "fail" and "free" in c.detail
    c = check_checkpoints(ctx_for(tmp_path / "b", info, checkpoints_root=ck, checkpoint_fail_free_bytes=1,
                                  checkpoint_min_free_bytes=1 << 60))
    assert c.status == "warn"


def test_checkpoint_locks_hold_between_two_processes_on_a_local_volume(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    c = check_checkpoint_locks(ctx_for(tmp_path, ROOT_LINE + line(40, "259:1", str(ck), "xfs", "/dev/nvme1n1"),
                                       checkpoints_root=ck))
    assert c.status == "ok" and "flock holds between two processes" in c.detail, c
    assert sorted(os.listdir(ck)) == [], "the probe's lock file is gone"


@pytest.mark.parametrize(
    ("fstype", "super_options", "status", "words"),
    [
        ("nfs", "rw,vers=3,nolock", "fail", "nolock"),
        ("nfs4", "rw,vers=4.2,local_lock=flock", "fail", "local_lock"),
        ("nfs", "rw,vers=3,local_lock=none", "warn", "lockd"),
        ("nfs4", "rw,vers=4.2,local_lock=none", "ok", "holds"),
        ("lustre", "rw,localflock", "fail", "-o flock"),
        ("lustre", "rw,flock", "ok", "holds"),
    ],
)
def test_checkpoint_locks_judge_the_mount_options_that_make_flock_local(tmp_path: Path, fstype, super_options,
                                                                         status, words) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    info = ROOT_LINE + f"40 1 0:52 / {ck} rw,relatime shared:40 - {fstype} srv:/vol {super_options}\n"
    c = check_checkpoint_locks(ctx_for(tmp_path, info, checkpoints_root=ck))
    assert (c.status, words in c.detail) == (status, True), c


def test_checkpoint_locks_of_a_missing_root_are_unknown(tmp_path: Path) -> None:
    c = check_checkpoint_locks(ctx_for(tmp_path, ROOT_LINE, checkpoints_root=tmp_path / "none"))
    assert c.status == "unknown" and "does not exist" in c.detail


def test_mountinfo_longest_prefix_and_escapes() -> None:
    mounts = parse_mountinfo(ROOT_LINE + line(30, "259:1", "/data set", "ext4", "/dev/nvme0n1p1")
                             + line(31, "0:60", "/data set/remote", "nfs4", "srv:/x"))
    assert mount_for(Path("/data set/remote/a/b"), mounts).fstype == "nfs4"
    assert mount_for(Path("/data set/local"), mounts).source == "/dev/nvme0n1p1"
    assert mount_for(Path("/data setx"), mounts).mount_point == "/"


# --- staging target ------------------------------------------------------------------------------


@pytest.fixture
def disks(tmp_path: Path) -> Path:
    s = make_sys(tmp_path)
    add_disk(s, "vda", "254:0", rotational=1)
    add_disk(s, "nvme0n1", "259:0", part=("nvme0n1p1", "259:1"))
    add_disk(s, "nvme1n1", "259:2")
    add_disk(s, "nvme2n1", "259:3", model="Amazon Elastic Block Store")
    add_disk(s, "sda", "8:0", rotational=1)
    add_disk(s, "sdb", "8:16", rotational=0)
    add_disk(s, "md0", "9:0", slaves=("nvme0n1", "nvme1n1"))
    return s


@pytest.mark.parametrize(
    ("dev", "fstype", "source", "status", "words"),
    [
        ("259:1", "ext4", "/dev/nvme0n1p1", "ok", "nvme: nvme0n1"),
        ("9:0", "xfs", "/dev/md0", "ok", "nvme0n1, nvme1n1"),
        ("8:0", "ext4", "/dev/sda1", "fail", "hdd"),
        ("8:16", "ext4", "/dev/sdb", "warn", "not NVMe"),
        ("254:0", "ext4", "/dev/vda", "fail", "virtio"),
        ("259:3", "ext4", "/dev/nvme2n1", "fail", "network-nvme"),
        ("0:50", "nfs4", "srv:/data", "fail", "over the network"),
        ("0:51", "virtiofs", "data", "fail", "over the network"),
        ("0:52", "tmpfs", "tmpfs", "warn", "RAM-backed"),
    ],
)
def test_staging_target_must_be_local_nvme(tmp_path: Path, disks: Path, dev, fstype, source, status, words) -> None:
    info = ROOT_LINE + line(40, dev, "/nvme", fstype, source) + line(41, "0:60", "/mnt/volume", "nfs4", "srv:/vol")
    c = check_staging(ctx_for(tmp_path, info, sys_root=disks,
                              staging=[(Path("/mnt/volume/data"), Path("/nvme/data"))]))[0]
    assert (c.status, words in c.detail) == (status, True), c
    assert "source /mnt/volume/data on nfs4" in c.detail


def test_staging_source_and_target_on_one_filesystem(tmp_path: Path, disks: Path) -> None:
    info = ROOT_LINE + line(40, "259:1", "/nvme", "ext4", "/dev/nvme0n1p1")
    c = check_staging(ctx_for(tmp_path, info, sys_root=disks, staging=[(Path("/nvme/a"), Path("/nvme/b"))]))[0]
    assert c.status == "warn" and "share one filesystem" in c.detail


def test_no_staging_configured_names_the_local_nvme(tmp_path: Path, disks: Path) -> None:
    c = check_staging(ctx_for(tmp_path, ROOT_LINE, sys_root=disks))[0]
    assert c.status == "ok" and "nvme0n1, nvme1n1" in c.detail and "nvme2n1" not in c.detail


def test_no_staging_and_no_nvme_is_a_fact_not_a_problem(tmp_path: Path) -> None:
    s = make_sys(tmp_path)
    add_disk(s, "vda", "254:0", rotational=1)
    c = check_staging(ctx_for(tmp_path, ROOT_LINE, sys_root=s))[0]
    assert c.status == "ok" and "no local NVMe disk" in c.detail and "vda (virtio)" in c.detail


# --- spool and state -----------------------------------------------------------------------------


def spool_ctx(tmp_path: Path, **kw) -> DoctorContext:
    return DoctorContext(spool_dir=tmp_path / "spool", state_dir=tmp_path / "state", owner_uid=os.geteuid(),
                         mountinfo=Path("/proc/self/mountinfo"), **kw)


@pytest.mark.parametrize(("mode", "status"), [(0o1733, "ok"), (0o755, "fail"), (0o1777, "fail"), (0o733, "fail")])
def test_spool_mode(tmp_path: Path, mode: int, status: str) -> None:
    (tmp_path / "spool").mkdir()
    (tmp_path / "spool").chmod(mode)
    c = check_spool(spool_ctx(tmp_path))
    assert c.status == status, c
    assert f"mode {mode:04o}" in c.detail


def test_spool_1730_needs_a_submit_group(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    spool.chmod(0o1730)
    groups = [g for g in os.getgroups() if g != 0]
    if os.geteuid() == 0:
        os.chown(spool, -1, 0)
        assert check_spool(spool_ctx(tmp_path)).status == "fail"
        os.chown(spool, -1, 65534)
    elif groups:
        os.chown(spool, -1, groups[0])
    else:
        pytest.skip("no non-root group to give the spool")
    assert check_spool(spool_ctx(tmp_path)).status == "ok"


def test_spool_symlink_and_missing(tmp_path: Path) -> None:
    c = check_spool(spool_ctx(tmp_path))
    assert c.status == "fail" and "does not exist" in c.detail and "1730" in c.fix
    (tmp_path / "real").mkdir(mode=0o1733)
    (tmp_path / "spool").symlink_to(tmp_path / "real")
    assert "symlink" in check_spool(spool_ctx(tmp_path)).detail


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the spool another owner")
def test_spool_owned_by_someone_else(tmp_path: Path) -> None:
    (tmp_path / "spool").mkdir()
    (tmp_path / "spool").chmod(0o1733)
    os.chown(tmp_path / "spool", 65534, -1)
    c = check_spool(spool_ctx(tmp_path))
    assert c.status == "fail" and "owned by uid 65534" in c.detail


def test_state_dir(tmp_path: Path) -> None:
    assert check_state(spool_ctx(tmp_path)).status == "warn"
    (tmp_path / "state").mkdir(mode=0o700)
    assert check_state(spool_ctx(tmp_path)).status == "ok"
    (tmp_path / "state").chmod(0o777)
    assert check_state(spool_ctx(tmp_path)).status == "fail"


# --- unit ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("props", "status", "words"),
    [
        ({"LoadState": "not-found", "UnitFileState": "", "ActiveState": "inactive", "SubState": "dead"},
         "fail", "not installed"),
        ({"LoadState": "loaded", "UnitFileState": "disabled", "ActiveState": "active", "SubState": "running"},
         "fail", "disabled"),
        ({"LoadState": "loaded", "UnitFileState": "enabled", "ActiveState": "failed", "SubState": "failed"},
         "fail", "failed"),
        ({"LoadState": "loaded", "UnitFileState": "enabled", "ActiveState": "active", "SubState": "running"},
         "ok", "active (running)"),
    ],
)
def test_unit_states(props, status, words) -> None:
    c = unit_check("spx-trainer", props)
    assert c.status == status and words in c.detail


def test_unit_without_systemd_as_pid1_is_unknown(tmp_path: Path) -> None:
    c = check_unit(DoctorContext(proc_root=make_proc(tmp_path, hypervisor=False, pid1="bash")))
    assert c.status == "unknown" and "PID 1 is bash" in c.detail


# --- worker environment --------------------------------------------------------------------------


def test_worker_judgements() -> None:
    cpu = {"python": "3.11.7", "torch": "2.13.0+cpu", "cuda": None, "cuda_devices": 0, "deepspeed": "0.19.8"}
    cuda = {**cpu, "torch": "2.13.0+cu124", "cuda": "12.4", "cuda_devices": 8}
    assert worker_check("py", cpu, gpus=0, fake=False).status == "ok"
    assert worker_check("py", cpu, gpus=8, fake=True).status == "ok"
    assert "CPU-only" in worker_check("py", cpu, gpus=8, fake=False).detail
    assert worker_check("py", cuda, gpus=8, fake=False).status == "ok"
    assert "sees 4 of 8" in worker_check("py", {**cuda, "cuda_devices": 4}, gpus=8, fake=False).detail
    no_ds = {k: v for k, v in cpu.items() if k != "deepspeed"} | {"deepspeed_error": "ModuleNotFoundError"}
    assert worker_check("py", no_ds, gpus=0, fake=False).status == "warn"
    assert worker_check("py", {"python": "3.11", "torch_error": "ModuleNotFoundError: torch"}, 0, False).status == "fail"


def test_worker_python_missing(tmp_path: Path) -> None:
    c = check_worker(DoctorContext(worker_python=str(tmp_path / "nope" / "python")))
    assert c.status == "fail" and "does not exist" in c.detail


def test_worker_python_without_torch(tmp_path: Path) -> None:
    """A real interpreter with no site-packages: the probe runs and reports torch missing."""
    py = tmp_path / "python-bare"
    py.write_text(f"#!/bin/sh\nexec {os.path.realpath(sys.executable)} -I -S \"$@\"\n")
    py.chmod(0o755)
    c = check_worker(DoctorContext(worker_python=str(py)))
    assert c.status == "fail" and "torch is not importable" in c.detail and "ModuleNotFoundError" in c.detail


# --- GPUs through the project's fake NVML --------------------------------------------------------


def fake_backend(**change) -> GpuBackend:
    fixture = json.loads(DEFAULT_FIXTURE.read_text())
    fixture = copy.deepcopy(fixture)
    n = change.pop("count", None)
    if n is not None:
        fixture["devices"] = fixture["devices"][:n]
    for d in fixture["devices"]:
        d.update(change)
    fake = FakeNvml(fixture)
    fake.nvmlInit()
    return GpuBackend("fake", "fake: test fixture", fake, fake.driver_version)


def test_fake_host_reports_gpu3_link7_down() -> None:
    with open_backend("fake") as b:
        checks = {c.name: c for c in run_checks(DoctorContext(backend=b), only=["gpus", "nvlink", "bf16", "driver"])}
    assert checks["gpus"].status == "ok" and checks["gpus"].detail.startswith("8× NVIDIA H100 80GB HBM3")
    assert checks["nvlink"].status == "fail"
    assert "GPU 3: link 7 down (17/18 up)" in checks["nvlink"].detail
    assert "143/144 up" in checks["nvlink"].detail and "-i 3" in checks["nvlink"].fix
    assert checks["bf16"].status == "ok" and "9.0" in checks["bf16"].detail
    assert checks["driver"].status == "ok" and "550.90.07" in checks["driver"].detail


def test_all_links_up_is_ok() -> None:
    with fake_backend(nvlink_down=[]) as b:
        c = gpu_checks.check_nvlink(DoctorContext(backend=b))
    assert c.status == "ok" and "all 144 up" in c.detail


def test_pcie_gpus_without_nvlink_are_a_warning() -> None:
    with fake_backend(nvlink_links=0, nvlink_down=[], name="NVIDIA H100 PCIe", count=4) as b:
        checks = {c.name: c for c in run_checks(DoctorContext(backend=b), only=["gpus", "nvlink"])}
    assert checks["gpus"].status == "ok" and checks["gpus"].detail.startswith("4× NVIDIA H100 PCIe")
    assert checks["nvlink"].status == "warn" and "PCIe" in checks["nvlink"].detail


def test_any_gpu_count_is_a_host_but_old_gpus_fail_bf16() -> None:
    for count in (1, 2, 5):
        with fake_backend(count=count) as b:
            c = gpu_checks.check_gpus(DoctorContext(backend=b))
        assert (c.status, c.detail.split(" (")[0]) == ("ok", f"{count}× NVIDIA H100 80GB HBM3"), c
    with fake_backend(name="Tesla V100-SXM2-32GB", count=8) as b:
        c = gpu_checks.check_bf16(DoctorContext(backend=b))
    assert c.status == "fail" and "7.0" in c.detail and "fp16" in c.fix


def test_no_gpu_backend(tmp_path: Path) -> None:
    none = GpuBackend("none", "none: NVML not available (NVML Shared Library Not Found)", None)
    ctx = DoctorContext(backend=none, proc_root=make_proc(tmp_path, hypervisor=False))  # no /proc/driver/nvidia
    checks = {c.name: c for c in run_checks(ctx, only=["gpus", "nvlink", "bf16", "driver"])}
    assert checks["gpus"].status == checks["driver"].status == "warn", "a host without GPUs runs CPU jobs"
    assert checks["gpus"].detail.startswith("no NVIDIA GPU visible: NVML not available (NVML Shared Library Not Found)")
    assert checks["nvlink"].status == checks["bf16"].status == "unknown"


# --- the report ----------------------------------------------------------------------------------


def test_render_json_and_exit_code() -> None:
    checks = [Check("a", "ok", "fine"), Check("b", "warn", "meh", "do x"), Check("c", "unknown", "?", "look")]
    text = render_text(checks)
    assert text.splitlines()[0] == "✓ a  fine"
    assert "! b  meh" in text and "   fix: do x" in text and "? c  ?" in text
    assert text.count("fix:") == 2
    assert exit_code(checks) == 0 and to_json(checks)["ok"] is True
    checks.append(Check("d", "fail", "broken", "repair"))
    assert exit_code(checks) == 1 and "✗ d  broken" in render_text(checks)
    doc = json.loads(json.dumps(to_json(checks)))
    assert doc["ok"] is False and doc["checks"][3] == {"name": "d", "status": "fail", "detail": "broken", "fix": "repair"}


def test_a_non_ok_check_must_say_a_fix() -> None:
    with pytest.raises(ValueError):
        Check("x", "fail", "broken")


def test_a_crashing_check_is_reported_not_raised(tmp_path: Path) -> None:
    ctx = DoctorContext(mountinfo=tmp_path / "missing-mountinfo", checkpoints_root=tmp_path)
    [c] = run_checks(ctx, only=["checkpoints"])
    assert c.status == "unknown" and "FileNotFoundError" in c.detail


# --- host: container evidence --------------------------------------------------------------------


def _detect_virt_script(tmp: Path, container: str) -> str:
    """A systemd-detect-virt that answers like the real one does from /.dockerenv alone."""
    script = tmp / "systemd-detect-virt"
    script.write_text(f'#!/bin/sh\n[ "$1" = --container ] && echo {container} || echo none\n')
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize(
    ("hypervisor", "marker", "root_fs", "cgroup", "detect", "status", "says"),
    [
        # A microVM built from a Docker image: /.dockerenv kept, root on a block device, no runtime.
        (True, True, ("ext4", "/dev/vda"), "0::/init.scope\n", "docker", "ok", "not a container: /.dockerenv present"),
        (False, True, ("ext4", "/dev/nvme0n1p2"), "0::/init.scope\n", "docker", "ok", "bare metal"),
        # Docker itself: the marker, an overlay root, the runtime in PID 1's cgroup (v1).
        (False, True, ("overlay", "overlay"), "12:pids:/docker/0123abcd\n", "docker", "warn",
         "inside a docker container (systemd-detect-virt --container: docker; /.dockerenv present; root is overlay"),
        # Kubernetes with containerd, no marker file, no systemd-detect-virt in the image.
        (False, False, ("overlay", "overlay"), "0::/kubepods/besteffort/pod1/abc\n", None, "warn",
         "inside a container (root is overlay on overlay; PID 1 cgroup 0::/kubepods"),
        (False, False, ("ext4", "/dev/nvme0n1p2"), "0::/init.scope\n", None, "ok", "bare metal"),
    ],
)
def test_container_needs_evidence_beyond_a_marker_file(tmp_path: Path, hypervisor, marker, root_fs, cgroup, detect,
                                                        status, says) -> None:
    proc = make_proc(tmp_path, hypervisor=hypervisor, mountinfo=line(20, "254:0", "/", *root_fs))
    (proc / "1" / "cgroup").write_text(cgroup)
    fs_root = tmp_path / "fs"
    (fs_root / "run").mkdir(parents=True)
    if marker:
        (fs_root / ".dockerenv").write_text("")
    ctx = DoctorContext(proc_root=proc, sys_root=make_sys(tmp_path), fs_root=fs_root,
                        detect_virt=_detect_virt_script(tmp_path, detect) if detect else None)
    c = check_host(ctx)
    assert c.status == status and says in c.detail, c
    if status != "warn":
        assert "inside a" not in c.detail


def test_quarantined_gpus_are_a_warning_that_says_how_to_release_them(tmp_path):
    from spx.daemon.doctor.gpu_checks import check_quarantine
    from spx.daemon.state.store import Store

    assert check_quarantine(tmp_path).status == "ok"  # no store yet
    store = Store(tmp_path / "spx.sqlite")
    assert check_quarantine(tmp_path).detail == "no GPU quarantined"
    store.host.quarantine_gpu(5, "GPU-5", "XID 79 on GPU 5 (GPU fell off the bus)", 1.0)
    store.close()
    c = check_quarantine(tmp_path)
    assert c.status == "warn" and c.detail == "1 GPU quarantined (GPU 5: XID 79 on GPU 5 (GPU fell off the bus))"
    assert c.fix.endswith("spx gpu release 5")
