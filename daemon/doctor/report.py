"""`spx doctor [--json]`: does this host have what training jobs and the daemon need?

    spx doctor            # one line per check, a fix under each that is not ✓
    spx doctor --json     # {"ok": ..., "checks": [{"name", "status", "detail", "fix"}, ...]}

Statuses: ✓ ok · ✗ fail (something jobs or the daemon need is missing or broken: a driver NVML does
not answer, a NVLink down, no BF16, checkpoints on a volume that does not persist, py-spy missing, a
job environment other users cannot run) · ! warn (works, but with a cost worth knowing: GPUs of
mixed models, PCIe instead of NVLink, jobs not confined to their GPUs) · ? unknown (this host cannot
tell; the detail says why). Any GPU count is a host, and so is a VM. `exit_code()` is 1 when
anything failed.

Every input comes through `DoctorContext`: the paths the daemon uses, the GPU backend (real NVML or the
fake), the worker python, and the /proc and /sys roots, so the tests point it at fixture files as well
as at the real machine. GPU facts come only from `backend.nvml`'s pynvml functions. torch and deepspeed
are never imported here: the worker's python is run in a subprocess to see whether they import.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spx.daemon.doctor import cgroup_checks, device_checks, gpu_checks, stackdump_checks, worker_checks
from spx.daemon.doctor.check import STATUSES, SYMBOL, Check
from spx.daemon.doctor.hostprobe import (
    ContainerFacts,
    dmi_says_vm,
    mount_for,
    probe_container,
    probe_virt,
    read_mounts,
)
from spx.daemon.doctor.storage_checks import check_checkpoint_locks, check_checkpoints, check_staging

GIB = 1 << 30


@dataclass
class DoctorContext:
    """What doctor looks at. Defaults are the real system daemon's paths and the real /proc and /sys.

    backend: the opened GpuBackend (kind "nvml", "fake" or "none"), or None when it was not opened
    (GPU checks then say "?"). owner_uid: who must own the spool and state dirs — 0 for the system
    daemon, the user's uid under `--root`. staging: (from, to) pairs of `data.stage` to judge.
    """

    spool_dir: Path = Path("/var/spool/spx")
    state_dir: Path = Path("/var/lib/spx")
    run_dir: Path = Path("/run/spx")
    checkpoints_root: Path = Path("/checkpoints")
    backend: Any = None
    worker_python: str | None = sys.executable
    unit: str = "spx-trainer"
    staging: Sequence[tuple[Path | None, Path]] = ()
    submit_group: str | None = None
    cgroups_mode: str = "auto"
    owner_uid: int = 0
    proc_root: Path = Path("/proc")
    sys_root: Path = Path("/sys")
    fs_root: Path = Path("/")  # where /.dockerenv and /run/systemd/container are looked for
    mountinfo: Path | None = None
    detect_virt: str | None = "systemd-detect-virt"
    systemctl: str = "systemctl"
    checkpoint_min_free_bytes: int = 100 * GIB
    checkpoint_fail_free_bytes: int = 5 * GIB
    worker_timeout_s: float = 180.0
    _mounts: list | None = field(default=None, repr=False)

    @property
    def mounts(self) -> list:
        if self._mounts is None:
            self._mounts = read_mounts(self.mountinfo or self.proc_root / "self" / "mountinfo")
        return self._mounts

    @classmethod
    def from_config(cls, config: Any, backend: Any, **overrides: Any) -> DoctorContext:
        """From a DaemonConfig: its spool, state and checkpoints paths and submit group."""
        return cls(
            spool_dir=config.spool_dir, state_dir=config.state_dir, run_dir=config.run_dir,
            checkpoints_root=config.checkpoints_root,
            submit_group=config.submit_group, cgroups_mode=config.cgroups, backend=backend, **overrides,
        )


# --- host -----------------------------------------------------------------------------------------


def check_host(ctx: DoctorContext) -> Check:
    """Bare metal or a VM, both fine (a VM's passed-through GPUs train as well; the nvlink check says
    whether their links are there); inside a container is a warning: it must pass the GPUs through."""
    v = probe_virt(ctx.proc_root / "cpuinfo", ctx.sys_root / "class" / "dmi" / "id", ctx.detect_virt)
    evidence = []
    if v.hypervisor_flag:
        evidence.append(f"hypervisor flag in {ctx.proc_root}/cpuinfo")
    if dmi_vm := dmi_says_vm(v.dmi):
        evidence.append(f"DMI: {dmi_vm}")
    if v.detect_virt_vm not in (None, "none"):
        evidence.append(f"systemd-detect-virt --vm: {v.detect_virt_vm}")
    sources = []
    if v.hypervisor_flag is False:
        sources.append("no hypervisor flag in cpuinfo")
    if v.dmi:
        sources.append(f"DMI: {v.dmi.get('sys_vendor', '?')} {v.dmi.get('product_name', '')}".strip())
    if v.detect_virt_vm == "none":
        sources.append("systemd-detect-virt --vm: none")
    if evidence:
        what = "virtual machine (" + "; ".join(evidence) + ")"
    elif sources:
        what = "bare metal (" + "; ".join(sources) + ")"
    else:
        what = "bare metal or virtual machine (no cpuinfo flags, DMI or systemd-detect-virt to tell)"
    container = _container_words(probe_container(ctx.fs_root, ctx.proc_root, _mounts_or_none(ctx), ctx.detect_virt))
    if container.startswith("; inside"):
        return Check("host", "warn", what + container,
                     "containers must pass every GPU and /dev/nvidia-caps through (e.g. --gpus all) and use host IPC")
    return Check("host", "ok", what + container)


def _mounts_or_none(ctx: DoctorContext) -> list:
    try:
        return ctx.mounts
    except OSError:
        return []


def _container_words(c: ContainerFacts) -> str:
    """"; inside a docker container (evidence)" when a runtime is corroborated; a marker file with
    nothing behind it is mentioned as such, so no VM is called a container for a leftover file."""
    if c.kind:
        evidence = [f"systemd-detect-virt --container: {c.detect_virt}"] if c.detect_virt not in (None, "none") else []
        evidence += [f"{m} present" for m in c.markers]
        if c.declared:
            evidence.append(f"/run/systemd/container: {c.declared}")
        if c.root_fs and c.root_fs.split(" ", 1)[0] in ("overlay", "aufs", "fuse-overlayfs"):
            evidence.append(f"root is {c.root_fs}")
        if c.runtime_cgroup:
            evidence.append(f"PID 1 cgroup {c.runtime_cgroup}")
        what = "a container" if c.kind == "container" else f"a {c.kind} container"
        return f"; inside {what} ({'; '.join(evidence)})"
    stray = [f"{m} present" for m in c.markers] or ([f"systemd-detect-virt --container: {c.detect_virt}"]
                                if c.detect_virt not in (None, "none") else [])
    if stray:
        return (f"; not a container: {', '.join(stray)} but root is {c.root_fs or 'unknown'}, "
                "no runtime in PID 1's cgroup (a file left from the image)")
    return ""


# --- daemon paths and unit ------------------------------------------------------------------------


def _insecure_ancestor(path: Path) -> str | None:
    for p in [path, *path.parents][1:]:
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
            return f"{p} is world-writable without the sticky bit"
        if st.st_uid != 0:
            return f"{p} is owned by uid {st.st_uid}, not root"
    return None


def check_spool(ctx: DoctorContext) -> Check:
    path = ctx.spool_dir
    owner = "root" if ctx.owner_uid == 0 else f"uid {ctx.owner_uid}"
    group = ctx.submit_group or "spx"
    fix = (f"install -d -o {owner if ctx.owner_uid else 'root'} -g {group} -m 1730 {path}  "
           f"(group {group} may submit; or -m 1733 to let every user submit)")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Check("spool", "fail", f"{path} does not exist", fix)
    if stat.S_ISLNK(st.st_mode):
        return Check("spool", "fail", f"{path} is a symlink (to {os.readlink(path)})", f"rm {path}; " + fix)
    if not stat.S_ISDIR(st.st_mode):
        return Check("spool", "fail", f"{path} is not a directory", fix)
    mode = stat.S_IMODE(st.st_mode)
    problems = []
    if st.st_uid != ctx.owner_uid:
        problems.append(f"owned by uid {st.st_uid}, not {owner}")
    if mode == 0o1730:
        if st.st_gid == 0:
            problems.append("mode 1730 but group root: nobody else can submit")
        elif ctx.submit_group and _group_name(st.st_gid) != ctx.submit_group:
            problems.append(f"group {_group_name(st.st_gid)}, config says submit_group {ctx.submit_group}")
    elif mode != 0o1733:
        problems.append(f"mode {mode:04o}, want 1733 (anyone submits) or 1730 with a submit group")
    if ctx.owner_uid == 0 and (bad := _insecure_ancestor(path)):
        problems.append(bad)
    detail = f"{path}: mode {mode:04o}, owner uid {st.st_uid}, group {_group_name(st.st_gid)}"
    if problems:
        return Check("spool", "fail", detail + ": " + "; ".join(problems), fix)
    return Check("spool", "ok", detail)


def _group_name(gid: int) -> str:
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def check_state(ctx: DoctorContext) -> Check:
    path = ctx.state_dir
    fix = f"install -d -m 0700 {path}  (root-only; the daemon keeps its SQLite store here)"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Check("state", "warn", f"{path} does not exist yet (the daemon creates it at first start)", fix)
    if not stat.S_ISDIR(st.st_mode):
        return Check("state", "fail", f"{path} is not a directory", fix)
    mode = stat.S_IMODE(st.st_mode)
    m = mount_for(path, ctx.mounts)
    detail = f"{path}: mode {mode:04o}, owner uid {st.st_uid}" + (f", {m.describe()}" if m else "")
    if st.st_uid != ctx.owner_uid or mode & 0o022:
        return Check("state", "fail", detail + ": must be owned by the daemon's user and writable only by it", fix)
    if m is not None and m.kind == "volatile":
        return Check("state", "fail", detail + ": not persistent, jobs would be forgotten at reboot",
                     f"put {path} on a persistent filesystem")
    return Check("state", "ok", detail)


def unit_check(unit: str, props: dict[str, str]) -> Check:
    """Judge `systemctl show UNIT -p LoadState,UnitFileState,ActiveState,SubState` output."""
    load, enabled = props.get("LoadState", "?"), props.get("UnitFileState", "?")
    active, sub = props.get("ActiveState", "?"), props.get("SubState", "?")
    detail = f"{unit}.service: {load}, {enabled or 'no unit file'}, {active} ({sub})"
    if load == "not-found":
        return Check("unit", "fail", f"{unit}.service is not installed",
                     f"sudo make install (systemd/install.sh puts it in /etc/systemd/system), then "
                     f"systemctl enable --now {unit}")
    if enabled not in ("enabled", "enabled-runtime", "static", "linked"):
        return Check("unit", "fail", detail, f"systemctl enable --now {unit} (so it comes back after a reboot)")
    if active != "active":
        return Check("unit", "fail", detail, f"systemctl start {unit}; journalctl -u {unit} -n 50 says why it stopped")
    return Check("unit", "ok", detail)


def check_unit(ctx: DoctorContext) -> Check:
    pid1 = (ctx.proc_root / "1" / "comm")
    try:
        init = pid1.read_text().strip()
    except OSError as e:
        init = f"unreadable ({e.strerror})"
    if init != "systemd":
        return Check("unit", "unknown", f"PID 1 is {init}, not systemd (a container?): cannot check {ctx.unit}.service",
                     f"on the host, run `systemctl status {ctx.unit}`; in a container run `spx-trainer` as its entry point")
    try:
        r = subprocess.run([ctx.systemctl, "show", f"{ctx.unit}.service",
                            "-p", "LoadState,UnitFileState,ActiveState,SubState"],
                           capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Check("unit", "unknown", f"systemctl failed: {e}", f"systemctl status {ctx.unit}")
    props = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    return unit_check(ctx.unit, props)


# --- the report -----------------------------------------------------------------------------------


def _guard(name: str, fn: Callable[[DoctorContext], Check | list[Check]], ctx: DoctorContext) -> list[Check]:
    """A check that crashes reports "?" with the error; it never hides the others."""
    try:
        out = fn(ctx)
    except Exception as e:  # noqa: BLE001 - one broken probe must not take down the report
        return [Check(name, "unknown", f"check crashed: {type(e).__name__}: {e}", "report this as a bug in spx doctor")]
    return out if isinstance(out, list) else [out]


CHECKS: list[tuple[str, Callable[[DoctorContext], Check | list[Check]]]] = [
    ("host", check_host),
    ("gpus", gpu_checks.check_gpus),
    ("nvlink", gpu_checks.check_nvlink),
    ("bf16", gpu_checks.check_bf16),
    ("driver", gpu_checks.check_driver),
    ("quarantine", lambda ctx: gpu_checks.check_quarantine(ctx.state_dir)),
    ("gpu-devices", device_checks.check_gpu_devices),
    ("checkpoints", check_checkpoints),
    ("checkpoint-locks", check_checkpoint_locks),
    ("staging", check_staging),
    ("spool", check_spool),
    ("state", check_state),
    ("unit", check_unit),
    ("cgroups", cgroup_checks.check_cgroups),
    ("py-spy", stackdump_checks.check_pyspy),
    ("worker-env", worker_checks.check_worker),
    ("worker-access", worker_checks.check_worker_access),
]


def run_checks(ctx: DoctorContext, only: Sequence[str] | None = None) -> list[Check]:
    checks: list[Check] = []
    for name, fn in CHECKS:
        if only is None or name in only:
            checks.extend(_guard(name, fn, ctx))
    return checks


def _unmarked(text: str, _status: str) -> str:
    return text


def render_text(checks: list[Check], mark: Callable[[str, str], str] = _unmarked) -> str:
    """The report for a person; `mark(text, status)` may colour each verdict's symbol (the CLI's,
    on a terminal)."""
    width = max((len(c.name) for c in checks), default=0)
    lines = []
    for c in checks:
        lines.append(f"{mark(SYMBOL[c.status], c.status)} {c.name:<{width}}  {c.detail}")
        if c.status != "ok":
            lines.append(f"  {' ' * width}  fix: {c.fix}")
    counts = {s: sum(c.status == s for c in checks) for s in STATUSES}
    lines.append(f"{counts['ok']} ok, {counts['fail']} failed, {counts['warn']} warning{'s' * (counts['warn'] != 1)}, "
                 f"{counts['unknown']} unknown")
    return "\n".join(lines) + "\n"


def to_json(checks: list[Check]) -> dict[str, Any]:
    """The `--json` document (a dict; the CLI dumps it)."""
    return {"ok": exit_code(checks) == 0, "checks": [asdict(c) for c in checks]}


def exit_code(checks: list[Check]) -> int:
    return 1 if any(c.status == "fail" for c in checks) else 0
