"""Which GPU device nodes an attempt may open: a cgroup v2 device program on its cgroup.

`CUDA_VISIBLE_DEVICES` only tells a job which GPUs to use; any process of any job can still open
every `/dev/nvidiaN` and compute on GPUs allocated to others. Under cgroup v2 the kernel's answer is
a BPF_PROG_TYPE_CGROUP_DEVICE program on the cgroup (what runc, systemd's DeviceAllow= and Slurm's
ConstrainDevices use): it runs at every open/mknod of a device node by a process in the cgroup or
below, and returning 0 makes the open fail with EPERM. So each attempt's cgroup gets one that denies
char major 195 (NVIDIA) minors 0..253 except its GPUs' minors; /dev/nvidiactl (195:255),
nvidia-modeset (195:254), nvidia-uvm and every other device are left alone: it only takes GPUs
away. A GPU's minor is NVML's `nvmlDeviceGetMinorNumber` (not always its index), passed in by the
service from the GPU backend.

It is attached with BPF_F_ALLOW_MULTI, so a device program of an ancestor (systemd's, for the unit's
DevicePolicy=) still applies: the kernel allows an access only if every program on the path does.
The program fd is closed once attached — the attachment holds the program, and it goes with the
cgroup — so an attempt adopted by a restarted daemon stays confined. A standby (standby.py) is
started in its cgroup before its GPUs are final: its filter allows no GPU (it sees none until its
plan either) and `Pending.settle` swaps it for the attempt's at `go`, before the plan reaches it —
the new program is attached before the old one is detached, so no moment allows more than either.

Loading a device program takes CAP_BPF and CAP_NET_ADMIN (or CAP_SYS_ADMIN). Where the kernel
refuses (those missing, a kernel without cgroup BPF) or attempt cgroups are not the daemon's to
manage, the job still runs, unconfined: `DeviceFilters` says so once in the log, and its finding is
kept in the run dir (`RECORD`) for `spx doctor`. Programs are loaded through the bpf(2) syscall with
ctypes: no dependency, and the program is a few instructions (`program`).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from spx.daemon.core.log import get_logger

log = get_logger()

NVIDIA_MAJOR = 195
LAST_GPU_MINOR = 253        # 254: nvidia-modeset, 255: nvidiactl (shared by every GPU user)
RECORD = "device-filter.json"  # in the run dir: what the running daemon found (spx doctor reads it)
PROGRAM_NAME = b"spx_gpus"     # how `bpftool cgroup tree` shows it
ENFORCED = "each attempt's cgroup may open only its own GPUs' /dev/nvidiaN (a cgroup device program)"
UNENFORCED = "jobs still run, but any job can open every /dev/nvidiaN (CUDA_VISIBLE_DEVICES only hides them)"
FIX_UNMANAGED = ("run the daemon in a cgroup of its own: the shipped systemd unit (Delegate=yes), "
                 "or `cgroups: on` where its cgroup is its own")
FIX_LOAD = ("give the daemon CAP_BPF and CAP_NET_ADMIN (the shipped unit does: drop a drop-in that takes "
            "them away, `systemctl cat spx-trainer` shows it, then restart; before Linux 5.8: CAP_SYS_ADMIN), "
            "on a kernel with CONFIG_CGROUP_BPF")
FIX_ATTACH = ("an ancestor cgroup may hold a device program attached without BPF_F_ALLOW_MULTI "
              "(`bpftool cgroup tree` shows it); let the daemon's cgroup take programs of its own")

# bpf(2): commands, the program and attach types, flags (include/uapi/linux/bpf.h)
BPF_PROG_LOAD, BPF_PROG_ATTACH, BPF_PROG_DETACH = 5, 8, 9
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_MULTI = 2
BPF_DEVCG_DEV_CHAR = 2
SYS_BPF = {"x86_64": 321, "aarch64": 280}
ATTR_SIZE = 128  # bytes of union bpf_attr passed; the kernel takes the zeros past its own size as unset
VERIFIER_LOG_SIZE = 1 << 16

# The few eBPF instructions the program uses: (opcode, dst, src, off, imm), 8 bytes each.
LDX_W = 0x61    # dst = *(u32 *)(src + off)
AND32_K = 0x54  # dst &= imm (32-bit)
JNE_K = 0x55    # if dst != imm: pc += off
JGT_K = 0x25    # if dst > imm (unsigned): pc += off
JEQ_K = 0x15    # if dst == imm: pc += off
MOV64_K = 0xB7  # dst = imm
EXIT = 0x95     # return r0
# struct bpf_cgroup_dev_ctx { u32 access_type ((ACC << 16) | DEV_TYPE); u32 major; u32 minor; }
CTX_ACCESS_TYPE, CTX_MAJOR, CTX_MINOR = 0, 4, 8


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def program(allowed_minors: Iterable[int]) -> bytes:
    """The device program: 0 (deny) for a char device 195:M with M <= 253 not in `allowed_minors`,
    1 (allow) for everything else. Minors outside 0..253 are ignored: nvidiactl and nvidia-modeset
    are always allowed, so listing them changes nothing."""
    allowed = sorted({m for m in allowed_minors if 0 <= m <= LAST_GPU_MINOR})
    allow_at = 7 + len(allowed) + 2  # where `allow` starts: after the 7 checks, one per minor, and `deny`
    insns: list[bytes] = []

    def to_allow(code: int, dst: int, imm: int) -> None:  # a jump's offset counts from the next insn
        insns.append(_insn(code, dst=dst, off=allow_at - len(insns) - 1, imm=imm))

    insns.append(_insn(LDX_W, dst=2, src=1, off=CTX_ACCESS_TYPE))
    insns.append(_insn(AND32_K, dst=2, imm=0xFFFF))                 # the device type
    to_allow(JNE_K, 2, BPF_DEVCG_DEV_CHAR)                         # not a char device
    insns.append(_insn(LDX_W, dst=3, src=1, off=CTX_MAJOR))
    to_allow(JNE_K, 3, NVIDIA_MAJOR)                               # not NVIDIA's
    insns.append(_insn(LDX_W, dst=4, src=1, off=CTX_MINOR))
    to_allow(JGT_K, 4, LAST_GPU_MINOR)                             # nvidia-modeset, nvidiactl
    for minor in allowed:
        to_allow(JEQ_K, 4, minor)                                  # one of the attempt's GPUs
    insns += [_insn(MOV64_K, dst=0, imm=0), _insn(EXIT)]           # deny: another job's GPU
    assert len(insns) == allow_at
    insns += [_insn(MOV64_K, dst=0, imm=1), _insn(EXIT)]           # allow
    return b"".join(insns)


# --- bpf(2) --------------------------------------------------------------------------------------


def _bpf(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    """One bpf(2) call; its result (an fd for a load), or OSError with the kernel's errno."""
    number = SYS_BPF.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"bpf(2) syscall number unknown on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(ctypes.c_long(number), ctypes.c_int(cmd), attr, ctypes.c_uint(ATTR_SIZE))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(result)


def load(allowed_minors: Iterable[int]) -> int:
    """Load the program for `allowed_minors`; its fd (the caller closes it). OSError where the kernel
    refuses: EPERM without CAP_BPF/CAP_SYS_ADMIN, EINVAL on a kernel without cgroup device programs;
    a program the verifier rejects says why (it never should: that is a bug here)."""
    code = program(allowed_minors)
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"Apache-2.0")
    verifier_log = ctypes.create_string_buffer(VERIFIER_LOG_SIZE)
    for log_level in (0, 1):  # the verifier's log only to say why it refused
        attr = ctypes.create_string_buffer(ATTR_SIZE)
        struct.pack_into("<IIQQIIQII16sII", attr, 0, BPF_PROG_TYPE_CGROUP_DEVICE, len(code) // 8,
                         ctypes.addressof(insns), ctypes.addressof(license_), log_level,
                         VERIFIER_LOG_SIZE if log_level else 0, ctypes.addressof(verifier_log) if log_level else 0,
                         0, 0, PROGRAM_NAME, 0, BPF_CGROUP_DEVICE)
        try:
            return _bpf(BPF_PROG_LOAD, attr)
        except OSError as e:
            if log_level or e.errno != errno.EACCES:
                said = verifier_log.value.decode(errors="replace").strip()
                raise OSError(e.errno, f"BPF_PROG_LOAD: {e.strerror}" + (f" (verifier: {said})" if said else "")) from None
    raise AssertionError("unreachable")


def _attach_call(cmd: int, cgroup: Path, prog_fd: int, flags: int) -> None:
    target = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        attr = ctypes.create_string_buffer(ATTR_SIZE)
        struct.pack_into("<IIII", attr, 0, target, prog_fd, BPF_CGROUP_DEVICE, flags)
        try:
            _bpf(cmd, attr)
        except OSError as e:
            name = "BPF_PROG_ATTACH" if cmd == BPF_PROG_ATTACH else "BPF_PROG_DETACH"
            raise OSError(e.errno, f"{name} to {cgroup}: {e.strerror}") from None
    finally:
        os.close(target)


def attach(cgroup: Path, prog_fd: int) -> None:
    """Attach the program to `cgroup`, beside any other (BPF_F_ALLOW_MULTI)."""
    _attach_call(BPF_PROG_ATTACH, cgroup, prog_fd, BPF_F_ALLOW_MULTI)


def detach(cgroup: Path, prog_fd: int) -> None:
    _attach_call(BPF_PROG_DETACH, cgroup, prog_fd, 0)


def confine(cgroup: Path, allowed_minors: Iterable[int]) -> None:
    """Load and attach a filter allowing `allowed_minors`; the attachment keeps it (fd closed)."""
    fd = load(allowed_minors)
    try:
        attach(cgroup, fd)
    finally:
        os.close(fd)


class Pending:
    """A filter that allows no GPU, attached to a standby's cgroup until its plan: `settle` swaps in
    the attempt's; `close` (always, after) lets the program go with the cgroup."""

    def __init__(self, cgroup: Path) -> None:
        self.cgroup = cgroup
        self.fd: int | None = load(())
        try:
            attach(cgroup, self.fd)
        except BaseException:
            self.close()
            raise

    def settle(self, allowed_minors: Iterable[int]) -> None:
        """Attach the attempt's filter, then take this one off. OSError leaves the cgroup with no GPU
        (both, or this one, attached): the caller launches cold in a fresh cgroup instead."""
        assert self.fd is not None, "settled twice"
        confine(self.cgroup, allowed_minors)
        detach(self.cgroup, self.fd)
        self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# --- the daemon's side: which minors, and saying once when it cannot ------------------------------


class DeviceFilters:
    """The daemon's device filters: the minors of its GPUs, and whether the kernel lets it confine.

    `minors` maps a GPU index to its device minor (None: NVML could not say; such a GPU is never
    opened by a job). `unmanaged`: why attempt cgroups are not managed (None: they are); then no
    attempt has a cgroup to confine, and that is the finding. `record` keeps each finding for
    `spx doctor` (the service writes it to `RECORD` in the run dir); it may raise OSError."""

    def __init__(self, minors: Mapping[int, int | None], unmanaged: str | None,
                 record: Callable[[dict[str, object]], None] = lambda finding: None) -> None:
        self.minors = dict(minors)
        self.record = record
        self.unavailable: str | None = None  # why no attempt is confined (found at start)
        self.attach_failed = False  # an attach failed once (said then; each attempt still tries)
        if unmanaged is not None:
            self.unavailable = f"attempt cgroups are not managed ({unmanaged})"
            self._say(self.unavailable, FIX_UNMANAGED, None, None)
            return
        try:
            os.close(load(()))
        except OSError as e:
            self.unavailable = f"the kernel refuses a cgroup device program: {_errno_text(e)}"
            self._say(self.unavailable, FIX_LOAD, None, None)
            return
        log.info("device_filter", job=None, attempt=None, enforced=True, detail=ENFORCED)
        self._write({"enforced": True, "detail": ENFORCED})

    def allowed(self, gpus: Sequence[int]) -> list[int]:
        return [m for g in gpus if (m := self.minors.get(g)) is not None]

    def confine(self, cgroup: Path, gpus: Sequence[int], job: str, attempt: int) -> bool:
        """Confine an attempt's cgroup to `gpus` (none for a `gpus: 0` job). False if not confined:
        the attempt runs anyway, and the first such failure is logged and recorded."""
        if self.unavailable is not None:
            return False
        try:
            confine(cgroup, self.allowed(gpus))
            return True
        except OSError as e:
            self._attach_failed(e, job, attempt)
            return False

    def pending(self, cgroup: Path, job: str, attempt: int) -> Pending | None:
        """A standby's filter (no GPU until its plan), or None where attempts are not confined."""
        if self.unavailable is not None:
            return None
        try:
            return Pending(cgroup)
        except OSError as e:
            self._attach_failed(e, job, attempt)
            return None

    def _attach_failed(self, e: OSError, job: str, attempt: int) -> None:
        """Each attempt tries anew (its `attempt_started` line says whether it is confined); the
        first failure is the one logged and recorded."""
        if not self.attach_failed:
            self.attach_failed = True
            self._say(f"cannot attach a device program to an attempt's cgroup: {_errno_text(e)}", FIX_ATTACH,
                      job, attempt)

    def _say(self, why: str, fix: str, job: str | None, attempt: int | None) -> None:
        log.warning("device_filter", job=job, attempt=attempt, enforced=False, error=why, fix=fix, detail=UNENFORCED)
        self._write({"enforced": False, "detail": why, "fix": fix})

    def _write(self, finding: dict[str, object]) -> None:
        try:
            self.record(finding)
        except OSError as e:
            log.warning("device_filter_record_failed", job=None, attempt=None, error=str(e))


def _errno_text(e: OSError) -> str:
    """"Operation not permitted (EPERM)": the words, and the name to look up."""
    return f"{e.strerror} ({errno.errorcode.get(e.errno or 0, e.errno)})"
