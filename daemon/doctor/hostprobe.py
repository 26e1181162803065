"""Facts about the host that `spx doctor` judges: mounts, block devices, virtualization.

Every function reads from paths passed in (`/proc/self/mountinfo`, a `/sys` root, `/proc/cpuinfo`), so
tests run them on fixture files as well as on the real machine. Stdlib only; nothing here decides what is
good or bad, that is `doctor.py`'s job.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Filesystems whose bytes travel over a network or a hypervisor channel.
NETWORK_FS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "virtiofs", "9p", "ceph", "glusterfs", "lustre", "beegfs",
    "gpfs", "afs", "fuse", "fuse.sshfs",
})
# Filesystems whose contents do not survive a reboot or a redeploy of the container.
VOLATILE_FS = frozenset({"tmpfs", "ramfs", "overlay", "aufs", "devtmpfs", "rootfs"})


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo."""

    mount_id: int
    parent_id: int
    dev: tuple[int, int]
    root: str
    mount_point: str
    options: tuple[str, ...]
    fstype: str
    source: str
    super_options: tuple[str, ...] = ()  # the file system's own (NFS's vers=, local_lock=; Lustre's flock)

    @property
    def read_only(self) -> bool:
        return "ro" in self.options

    @property
    def kind(self) -> str:
        """"network" (NFS, virtiofs, 9p, FUSE…), "volatile" (tmpfs, overlay…) or "local"."""
        if self.fstype in NETWORK_FS or self.fstype.startswith("fuse.") or self.fstype.startswith("nfs"):
            return "network"
        if self.fstype in VOLATILE_FS:
            return "volatile"
        return "local"

    def describe(self) -> str:
        return f"{self.fstype} {self.source}"


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        f = left.split()
        r = right.split()
        if len(f) < 6 or len(r) < 2:
            continue
        major, _, minor = f[2].partition(":")
        mounts.append(
            Mount(int(f[0]), int(f[1]), (int(major), int(minor)), _unescape(f[3]), _unescape(f[4]),
                  tuple(f[5].split(",")), r[0], _unescape(r[1]), tuple(r[2].split(",")) if len(r) > 2 else ())
        )
    return mounts


def read_mounts(mountinfo: Path) -> list[Mount]:
    return parse_mountinfo(mountinfo.read_text())


def existing_ancestor(path: Path) -> Path:
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def mount_for(path: Path, mounts: list[Mount]) -> Mount | None:
    """The mount the path (or, if it does not exist yet, its nearest existing ancestor) lives on.
    With the same mount point mounted twice, the later line is the one on top."""
    absolute = os.path.abspath(path)
    ancestor = str(existing_ancestor(path))
    real = os.path.normpath(os.path.join(os.path.realpath(ancestor), os.path.relpath(absolute, ancestor)))
    best: Mount | None = None
    for m in mounts:
        mp = m.mount_point
        inside = real == mp or mp == "/" or real.startswith(mp.rstrip("/") + "/")
        if inside and (best is None or len(mp) >= len(best.mount_point)):
            best = m
    return best


def root_mount(mounts: list[Mount]) -> Mount | None:
    tops = [m for m in mounts if m.mount_point == "/"]
    return tops[-1] if tops else None


# --- block devices --------------------------------------------------------------------------------

# NVMe namespaces that are network block storage presented over NVMe (cloud persistent disks).
NETWORK_NVME_MODELS = ("Amazon Elastic Block Store", "PersistentDisk", "Google PersistentDisk")


@dataclass(frozen=True)
class BlockInfo:
    """The physical disks under a filesystem. kind: "nvme", "ssd", "hdd", "virtio" (a VM's virtual
    disk), "network-nvme" (e.g. EBS), "ram" (zram, ram disks) or "unknown"."""

    kind: str
    disks: tuple[str, ...]

    def describe(self) -> str:
        return ", ".join(self.disks) or "no block device"


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _disk_dir(path: Path) -> Path:
    return path.parent if (path / "partition").exists() else path


def _leaf_disks(dev_dir: Path, depth: int = 0) -> list[Path]:
    disk = _disk_dir(dev_dir)
    slaves = sorted((disk / "slaves").iterdir()) if (disk / "slaves").is_dir() else []
    if not slaves or depth > 8:
        return [disk]
    leaves: list[Path] = []
    for s in slaves:
        leaves.extend(_leaf_disks(Path(os.path.realpath(s)), depth + 1))
    return leaves


def _disk_kind(disk: Path) -> str:
    name = disk.name
    if name.startswith("nvme"):
        model = _read(disk / "device" / "model")
        return "network-nvme" if any(m in model for m in NETWORK_NVME_MODELS) else "nvme"
    if name.startswith(("zram", "ram", "pmem")):
        return "ram"
    if name.startswith(("vd", "xvd")):
        return "virtio"
    rotational = _read(disk / "queue" / "rotational")
    return {"0": "ssd", "1": "hdd"}.get(rotational, "unknown")


def block_info(mount: Mount, sys_root: Path) -> BlockInfo:
    """Classify the disks under a local filesystem via /sys/dev/block/MAJ:MIN (slaves followed
    through device-mapper and md RAID), falling back to /sys/class/block/<source name>."""
    candidates = [sys_root / "dev" / "block" / f"{mount.dev[0]}:{mount.dev[1]}"]
    if mount.source.startswith("/dev/"):
        candidates.append(sys_root / "class" / "block" / os.path.basename(mount.source))
    for c in candidates:
        if c.exists():
            leaves = _leaf_disks(Path(os.path.realpath(c)))
            kinds = [_disk_kind(d) for d in leaves]
            names = tuple(d.name for d in leaves)
            if all(k == kinds[0] for k in kinds):
                return BlockInfo(kinds[0], names)
            worst = next(k for k in ("ram", "hdd", "network-nvme", "virtio", "unknown", "ssd") if k in kinds)
            return BlockInfo(worst, names)
    return BlockInfo("unknown", ())


def local_nvme_disks(sys_root: Path) -> list[str]:
    """Names of the host's local NVMe namespaces (network-backed ones excluded)."""
    block = sys_root / "block"
    if not block.is_dir():
        return []
    return sorted(d.name for d in block.iterdir() if _disk_kind(block / d.name) == "nvme")


def all_disks(sys_root: Path) -> list[tuple[str, str]]:
    """(name, kind) of every block device in /sys/block except loop devices."""
    block = sys_root / "block"
    if not block.is_dir():
        return []
    return sorted((d.name, _disk_kind(block / d.name)) for d in block.iterdir() if not d.name.startswith("loop"))


# --- virtualization -------------------------------------------------------------------------------

DMI_VM_PATTERNS = (
    "KVM", "QEMU", "VMware", "VirtualBox", "innotek", "Xen", "Amazon EC2", "Google Compute Engine",
    "Google", "Microsoft Corporation Virtual Machine", "Virtual Machine", "OpenStack", "Parallels",
    "Bochs", "BHYVE", "Alibaba Cloud ECS", "Hetzner vServer", "DigitalOcean", "Oracle Cloud",
)


@dataclass(frozen=True)
class VirtFacts:
    """Evidence about the hypervisor. None = that source could not be read."""

    hypervisor_flag: bool | None
    dmi: dict[str, str]
    detect_virt_vm: str | None


def read_cpu_hypervisor_flag(cpuinfo: Path) -> bool | None:
    """True/False from the x86 `flags` lines; None when there are none (ARM) or it cannot be read."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    flags = [line for line in text.splitlines() if line.startswith("flags")]
    if not flags:
        return None
    return any("hypervisor" in line.split(":", 1)[-1].split() for line in flags)


def read_dmi(dmi_dir: Path) -> dict[str, str]:
    keys = ("sys_vendor", "product_name", "board_vendor", "bios_vendor")
    return {k: v for k in keys if (v := _read(dmi_dir / k))}


def _detect_virt(cmd: str | None, flag: str) -> str | None:
    if cmd is None:
        return None
    try:
        r = subprocess.run([cmd, flag], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() or None


def probe_virt(cpuinfo: Path, dmi_dir: Path, detect_virt: str | None) -> VirtFacts:
    return VirtFacts(
        read_cpu_hypervisor_flag(cpuinfo),
        read_dmi(dmi_dir),
        _detect_virt(detect_virt, "--vm"),
    )


def dmi_says_vm(dmi: dict[str, str]) -> str | None:
    """The DMI string that names a hypervisor, or None. Cloud bare-metal shapes (`*.metal`,
    `BM.*`) carry the cloud's vendor string too, so the product name is checked first."""
    product = dmi.get("product_name", "")
    if product.endswith(".metal") or product.startswith("BM."):
        return None
    text = " ".join(dmi.get(k, "") for k in ("sys_vendor", "product_name", "board_vendor", "bios_vendor"))
    for pattern in DMI_VM_PATTERNS:
        if pattern.lower() in text.lower():
            return f"{dmi.get('sys_vendor', '?')} {product}".strip()
    return None


# --- containers -----------------------------------------------------------------------------------

# Root filesystems of a container image (layers); a VM or a host boots from a block device instead.
CONTAINER_ROOT_FS = frozenset({"overlay", "aufs", "fuse-overlayfs"})
# Runtimes that name themselves in PID 1's cgroup path (cgroup v1, or v2 without a cgroup namespace).
_RUNTIME_CGROUP = re.compile(r"(docker|containerd|kubepods|libpod|crio|lxc|machine\.slice)", re.IGNORECASE)
MARKER_FILES = ("/.dockerenv", "/run/.containerenv")


@dataclass(frozen=True)
class ContainerFacts:
    """What says "container", each source on its own. A marker file alone is weak evidence: it is
    copied along when an image is turned into a VM disk (microVMs built from Docker images keep
    `/.dockerenv`), and `systemd-detect-virt --container` answers "docker" from that file alone."""

    detect_virt: str | None  # systemd-detect-virt --container ("none", "docker", …), None if unknown
    markers: tuple[str, ...]  # marker files present (/.dockerenv, /run/.containerenv)
    declared: str | None  # /run/systemd/container: written by the runtime itself (nspawn, podman)
    root_fs: str | None  # "overlay on overlay" … of "/", None if unknown
    runtime_cgroup: str | None  # a line of /proc/1/cgroup that names a runtime

    @property
    def corroborated(self) -> bool:
        """Evidence a runtime is really around this process, beyond a file anyone could leave."""
        layered = self.root_fs is not None and self.root_fs.split(" ", 1)[0] in CONTAINER_ROOT_FS
        return bool(self.declared or self.runtime_cgroup or layered)

    @property
    def kind(self) -> str | None:
        """The container type, only when corroborated; None on a host or VM (whatever the markers)."""
        if not self.corroborated:
            return None
        named = self.detect_virt if self.detect_virt not in (None, "none") else self.declared
        if named:
            return named
        if self.markers:
            return "docker" if "/.dockerenv" in self.markers else "podman"
        return "container"


def probe_container(fs_root: Path, proc_root: Path, mounts: list[Mount], detect_virt: str | None) -> ContainerFacts:
    markers = tuple(m for m in MARKER_FILES if (fs_root / m.lstrip("/")).exists())
    declared = _read(fs_root / "run" / "systemd" / "container") or None
    root = next((m for m in reversed(mounts) if m.mount_point == "/"), None)
    runtime = None
    try:
        for line in (proc_root / "1" / "cgroup").read_text().splitlines():
            if _RUNTIME_CGROUP.search(line.split(":", 2)[-1]):
                runtime = line
                break
    except OSError:
        pass
    return ContainerFacts(
        _detect_virt(detect_virt, "--container"), markers, declared,
        f"{root.fstype} on {root.source}" if root else None, runtime,
    )
