"""GPU device nodes per job (issue 25): the kernel lets an attempt open only its own GPUs' /dev/nvidiaN
(run/device_filter.py), with real cgroups, real processes and a real daemon.

No NVIDIA driver is needed: device nodes 195:N made in a temp dir stand in for /dev/nvidiaN. Opening
one the filter lets through reaches the kernel's char-device lookup — ENXIO here, where no driver
serves major 195 (it would open on a GPU host) — and one the filter refuses fails with EPERM first.
"""

from __future__ import annotations

import ctypes
import json
import os
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from scratch_cgroup import scratch_cgroup

from harness import Daemon
from spx.daemon.gpu.fake import DEFAULT_FIXTURE
from spx.daemon.run import device_filter

SCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"
OPEN_NODES = SCRIPTS / "open_gpu_nodes.py"
PY = sys.executable
GPU_NODES = [f"nvidia{n}" for n in range(8)]
SHARED_NODES = {"nvidia-modeset": 254, "nvidiactl": 255}
REACHED = ("opened", "ENXIO", "ENODEV")  # past the filter: the driver (or its absence) answered


@pytest.fixture
def scratch():
    with scratch_cgroup("spx-devfilter") as cg:
        yield cg


@pytest.fixture
def nodes(tmp_path) -> Path:
    """nvidia0..7, nvidia-modeset and nvidiactl as char devices 195:N in a temp dir."""
    d = tmp_path / "dev"
    d.mkdir()
    for name, minor in {**{n: i for i, n in enumerate(GPU_NODES)}, **SHARED_NODES}.items():
        os.mknod(d / name, stat.S_IFCHR | 0o666, os.makedev(device_filter.NVIDIA_MAJOR, minor))
    found = opened(d)
    if found["nvidia0"] not in REACHED:  # EACCES: a nodev mount, where no device node opens at all
        pytest.skip(f"device nodes in {d} cannot be opened here at all: {found['nvidia0']}")
    return d


def opened(nodes_dir: Path, cgroup: Path | None = None) -> dict[str, str]:
    """Each node's open result, from a process started in `cgroup` (None: ours)."""
    out = nodes_dir.parent / "out"
    out.mkdir(exist_ok=True)
    argv = [PY, str(OPEN_NODES), str(nodes_dir), str(out)]
    if cgroup is not None:
        argv = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup), *argv]
    subprocess.run(argv, check=True, timeout=60, env={"PATH": os.environ["PATH"], "SPX_JOB": "probe"})
    result = json.loads((out / "probe-0.json").read_text())["nodes"]
    (out / "probe-0.json").unlink()
    return result


def denied(result: dict[str, str]) -> set[str]:
    unexpected = {n: r for n, r in result.items() if r != "EPERM" and r not in REACHED}
    assert not unexpected, f"neither denied nor reached: {unexpected}"
    return {n for n, r in result.items() if r == "EPERM"}


class Opener:
    """A process living in a cgroup that opens nodes on request: what a standby is, across `settle`."""

    CODE = ("import errno, os, sys\n"
            "for line in sys.stdin:\n"
            "    try:\n"
            "        os.close(os.open(line.strip(), os.O_RDWR | os.O_NONBLOCK)); print('opened', flush=True)\n"
            "    except OSError as e:\n"
            "        print(errno.errorcode[e.errno], flush=True)\n")

    def __init__(self, cgroup: Path) -> None:
        self.proc = subprocess.Popen(["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup),
                                      PY, "-c", self.CODE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def open(self, path: Path) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{path}\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


# --- the program on a cgroup ---------------------------------------------------------------------


def test_a_confined_cgroup_opens_only_its_gpus_nodes(scratch, nodes):
    attempt = scratch / "attempt"
    attempt.mkdir()
    device_filter.confine(attempt, [1, 2])
    assert denied(opened(nodes, attempt)) == {"nvidia0", *GPU_NODES[3:]}, "nvidiactl and nvidia-modeset stay open"
    assert denied(opened(nodes)) == set(), "outside the cgroup nothing is filtered"
    none = scratch / "cpu-job"
    none.mkdir()
    device_filter.confine(none, [])
    assert denied(opened(nodes, none)) == set(GPU_NODES)


def test_a_standby_filter_allows_no_gpu_until_settled_then_only_the_attempts(scratch, nodes):
    """A process already in the cgroup (the standby's agent) is judged at each open: nothing before
    the plan, exactly the attempt's GPUs after — so the no-GPU program was detached, too."""
    cg = scratch / "standby"
    cg.mkdir()
    pending = device_filter.Pending(cg)
    agent = Opener(cg)
    try:
        assert {agent.open(nodes / n) for n in GPU_NODES} == {"EPERM"}
        assert agent.open(nodes / "nvidiactl") in REACHED
        pending.settle([2])
        assert pending.fd is None, "the program fds are closed once attached"
        assert agent.open(nodes / "nvidia2") in REACHED
        assert {agent.open(nodes / n) for n in GPU_NODES if n != "nvidia2"} == {"EPERM"}
    finally:
        agent.close()
        pending.close()


def test_an_ancestors_device_program_still_applies(scratch, nodes):
    """BPF_F_ALLOW_MULTI: the attempt's program joins the one above (systemd's DevicePolicy=), it
    does not replace it: an access must pass both."""
    device_filter.confine(scratch, [0, 1, 2])
    attempt = scratch / "attempt"
    attempt.mkdir()
    device_filter.confine(attempt, [2, 3])
    assert denied(opened(nodes, attempt)) == set(GPU_NODES) - {"nvidia2"}


def attach_non_overridable(cgroup: Path) -> None:
    """A device program attached without flags, as old container runtimes do: nothing below may
    attach its own."""
    fd = device_filter.load([])
    target = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        attr = ctypes.create_string_buffer(device_filter.ATTR_SIZE)
        struct.pack_into("<IIII", attr, 0, target, fd, device_filter.BPF_CGROUP_DEVICE, 0)
        device_filter._bpf(device_filter.BPF_PROG_ATTACH, attr)
    finally:
        os.close(target)
        os.close(fd)


def test_a_refused_attach_leaves_the_job_running_and_is_said_once(scratch):
    attach_non_overridable(scratch)
    findings: list[dict] = []
    filters = device_filter.DeviceFilters({0: 0}, None, findings.append)
    assert findings == [{"enforced": True, "detail": device_filter.ENFORCED}]
    for number in (1, 2):
        attempt = scratch / f"attempt-{number}"
        attempt.mkdir()
        assert filters.confine(attempt, [0], "j", number) is False
        assert filters.pending(attempt, "j", number) is None
    assert len(findings) == 2 and findings[1]["enforced"] is False, findings
    assert "Operation not permitted (EPERM)" in str(findings[1]["detail"]), findings[1]
    assert findings[1]["fix"] == device_filter.FIX_ATTACH


# --- through the daemon --------------------------------------------------------------------------


def python_job(name: str, gpus: str, nodes: Path, out: Path) -> str:
    return (f"name: {name}\nlauncher: python\nscript: {OPEN_NODES}\npython: {PY}\n"
            f"args: ['{nodes}', '{out}']\ngpus: {gpus}\n")


def test_each_job_opens_only_its_own_gpus_device_nodes(scratch, nodes, tmp_path):
    """GPUs [1, 2] open nvidia1 and nvidia2 only; `gpus: 0` opens none; a GPU whose minor is not its
    index (GPU 4 is /dev/nvidia7 in this fixture) opens by its minor; a torchrun job launched
    through its standby opens its GPU after the plan."""
    fixture = json.loads(DEFAULT_FIXTURE.read_text())
    minors = {4: 7, 5: 6, 6: 5, 7: 4}
    for index, spec in enumerate(fixture["devices"]):
        spec["minor"] = minors.get(index, index)
    (tmp_path / "gpus.json").write_text(json.dumps(fixture))
    out = tmp_path / "results"
    out.mkdir()
    d = Daemon(tmp_path / "root", gpu_backend="fake", config={"cgroups": "on"}, cgroup=scratch,
               extra_args=["--fake-gpus", str(tmp_path / "gpus.json")]).start()
    try:
        assert d.events("device_filter")[-1]["enforced"] is True
        d.drop("two.yaml", python_job("two", "[1, 2]", nodes, out))
        d.drop("cpu.yaml", python_job("cpu", "0", nodes, out))
        d.drop("swapped.yaml", python_job("swapped", "[4]", nodes, out))
        d.drop("ahead.yaml", f"name: ahead\nlauncher: torchrun\nscript: {OPEN_NODES}\npython: {PY}\n"
                             f"args: ['{nodes}', '{out}']\ngpus: [3]\nprocs: 1\n")
        results = {}
        for job in ("two", "cpu", "swapped", "ahead"):
            d.wait_state(job, {"succeeded", "failed"}, 180)
            assert d.job(job)["state"] == "succeeded", d.status(job)
            results[job] = json.loads((out / f"{job}-0.json").read_text())
            started = d.events("attempt_started", job=job)[0]
            assert started["devices_confined"] is True and started["cgroup"], started
        assert d.events("attempt_started", job="ahead")[0]["standby"] is not None, "launched through its standby"

        assert results["two"]["cuda_visible_devices"] == "1,2"
        assert denied(results["two"]["nodes"]) == set(GPU_NODES) - {"nvidia1", "nvidia2"}
        assert results["cpu"]["cuda_visible_devices"] == ""
        assert denied(results["cpu"]["nodes"]) == set(GPU_NODES)
        assert denied(results["swapped"]["nodes"]) == set(GPU_NODES) - {"nvidia7"}
        assert denied(results["ahead"]["nodes"]) == set(GPU_NODES) - {"nvidia3"}

        doctor = json.loads(d.spx("doctor", "--json", check=False, timeout=300).stdout)
        check = next(c for c in doctor["checks"] if c["name"] == "gpu-devices")
        assert check["status"] == "ok" and f"daemon pid {d.proc.pid}" in check["detail"], check
    finally:
        d.stop()


def test_a_daemon_that_cannot_confine_says_so_and_jobs_still_run(tmp_path, nodes):
    """No managed cgroups (`cgroups: off`): one warning at start, the record says why for `spx
    doctor`, and a job runs unconfined rather than not at all."""
    out = tmp_path / "results"
    out.mkdir()
    d = Daemon(tmp_path / "root", gpu_backend="fake", config={"cgroups": "off"}).start()
    try:
        said = d.events("device_filter")
        assert len(said) == 1 and said[0]["enforced"] is False and said[0]["level"] == "warning", said
        assert "cgroups: off" in said[0]["error"], said
        d.drop("two.yaml", python_job("two", "[1, 2]", nodes, out))
        d.wait_state("two", {"succeeded", "failed"}, 120)
        assert d.job("two")["state"] == "succeeded"
        assert d.events("attempt_started", job="two")[0]["devices_confined"] is False
        assert denied(json.loads((out / "two-0.json").read_text())["nodes"]) == set()
        record = json.loads((tmp_path / "root" / "run" / device_filter.RECORD).read_text())
        assert record["enforced"] is False and record["fix"] == device_filter.FIX_UNMANAGED, record
        assert len(d.events("device_filter")) == 1, "said once"
    finally:
        d.stop()


def test_without_cap_bpf_the_kernel_refuses_and_the_daemon_says_which_errno():
    """A process without CAP_BPF/CAP_SYS_ADMIN (here: nobody) cannot load the program: the finding
    names the kernel's errno and the fix, and no attempt is then tried."""
    code = ("import json, os, pathlib\n"
            "from spx.daemon.run import device_filter\n"  # before the switch: nobody may not read the stdlib
            "os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)\n"
            "found = []\n"
            "filters = device_filter.DeviceFilters({0: 0}, None, found.append)\n"
            "print(json.dumps([found, filters.confine(pathlib.Path('/nonexistent'), [0], 'j', 1)]))\n")
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    (finding,), confined = json.loads(r.stdout.splitlines()[-1])
    assert finding["enforced"] is False and finding["fix"] == device_filter.FIX_LOAD, finding
    assert finding["detail"] == ("the kernel refuses a cgroup device program: "
                                 "BPF_PROG_LOAD: Operation not permitted (EPERM)"), finding
    assert confined is False
