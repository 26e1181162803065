"""`spx doctor`'s GPU checks: count and model, NVLink (SXM) vs PCIe, BF16, driver/NVML versions.

Facts come only from the GPU backend's `nvml` (the real pynvml module or the fake with the same
function names), so the fake 8×H100 SXM5 fixture and a real host go through the same code.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spx.daemon.doctor.check import Check

if TYPE_CHECKING:
    from spx.daemon.doctor.report import DoctorContext

NVML_NVLINK_MAX_LINKS = 18 * 2  # pynvml.NVML_NVLINK_MAX_LINKS
NVML_FEATURE_ENABLED = 1

# Compute capability by model name, used only when NVML gives none (BF16 needs sm_80 or newer).
_CC_BY_NAME = (
    ("B200", (10, 0)), ("B100", (10, 0)), ("GB200", (10, 0)), ("H200", (9, 0)), ("H100", (9, 0)),
    ("H800", (9, 0)), ("GH200", (9, 0)), ("L40", (8, 9)), ("L4", (8, 9)), ("RTX 6000 Ada", (8, 9)),
    ("A100", (8, 0)), ("A800", (8, 0)), ("A30", (8, 0)), ("A40", (8, 6)), ("A10", (8, 6)),
    ("A6000", (8, 6)), ("V100", (7, 0)), ("T4", (7, 5)), ("P100", (6, 0)),
)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _reason(backend: Any) -> str:
    """The backend's description without its "none: " prefix."""
    return str(backend.description).removeprefix(f"{backend.kind}: ")


def _gpus(ctx: DoctorContext, name: str) -> tuple[Any, list[Any]] | Check:
    """(nvml, devices), or the "?" check to report when there is nothing to look at."""
    b = ctx.backend
    if b is None:
        return Check(name, "unknown", "GPU backend not opened", "run spx doctor with --gpu-backend auto")
    if b.nvml is None or not b.devices():
        return Check(name, "unknown", "no GPUs to check", "run spx doctor on the GPU host")
    return b.nvml, b.devices()


def check_gpus(ctx: DoctorContext) -> Check:
    b = ctx.backend
    if b is None:
        return Check("gpus", "unknown", "GPU backend not opened", "run spx doctor with --gpu-backend auto")
    if b.nvml is None:
        return Check("gpus", "warn", f"no NVIDIA GPU visible: {_reason(b)}; only CPU jobs (gpus: 0) run here",
                     "on a GPU host, install the NVIDIA driver and check that `nvidia-smi` lists the GPUs")
    devices = b.devices()
    if not devices:
        return Check("gpus", "fail", "NVML answers but finds no GPUs",
                     "check `nvidia-smi`: GPUs fallen off the bus need a reset or a reboot")
    return judge_gpus([(d.name, d.memory_total_bytes) for d in devices], fake=b.kind == "fake")


def judge_gpus(devices: list[tuple[str, int]], fake: bool = False) -> Check:
    """Any number of GPUs is a host: 1, 2, 16, a cloud VM's. What matters is that a job's GPUs are
    alike: data-parallel ranks step together, so one slower or smaller GPU paces (or limits) all."""
    by_model: dict[str, list[int]] = {}
    for name, memory in devices:
        by_model.setdefault(name, []).append(memory)
    gib = sorted({m / (1 << 30) for m in (mem for mems in by_model.values() for mem in mems)})
    detail = ", ".join(f"{len(mems)}× {name}" for name, mems in sorted(by_model.items()))
    detail += f" ({gib[0]:.1f} GiB each)" if len(gib) == 1 else f" ({gib[0]:.1f} to {gib[-1]:.1f} GiB)"
    if fake:
        detail += " (fake backend)"
    if len(by_model) > 1:
        return Check("gpus", "warn", detail + ": mixed models; a job on GPUs of two models steps at the slower "
                     "one's pace", "size multi-GPU jobs to the GPUs of one model (`spx gpus` lists them), or keep "
                     "one model per host")
    if len(gib) > 1:
        return Check("gpus", "warn", detail + ": one model with different memory sizes; a job's batch must fit "
                     "the smallest", "check `nvidia-smi -q -d MEMORY` (a MIG or memory-reservation setting on some GPUs?)")
    return Check("gpus", "ok", detail)


def _link_count(nvml: Any, handle: Any) -> int:
    """NVLink links of a GPU: the LINK_COUNT field, else probe nvmlDeviceGetNvLinkState until it errors."""
    fid = getattr(nvml, "NVML_FI_DEV_NVLINK_LINK_COUNT", 91)
    try:
        [value] = nvml.nvmlDeviceGetFieldValues(handle, [fid])
        if value.nvmlReturn == 0 and value.value.uiVal > 0:
            return int(value.value.uiVal)
    except nvml.NVMLError:
        pass
    count = 0
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", NVML_NVLINK_MAX_LINKS)):
        try:
            nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError:
            break
        count += 1
    return count


def check_nvlink(ctx: DoctorContext) -> Check:
    got = _gpus(ctx, "nvlink")
    if not isinstance(got, tuple):
        return got
    nvml, devices = got
    links: dict[int, int] = {}
    down: dict[int, list[int]] = {}
    try:
        for d in devices:
            h = nvml.nvmlDeviceGetHandleByIndex(d.index)
            links[d.index] = _link_count(nvml, h)
            down[d.index] = [
                link for link in range(links[d.index])
                if nvml.nvmlDeviceGetNvLinkState(h, link) != getattr(nvml, "NVML_FEATURE_ENABLED", NVML_FEATURE_ENABLED)
            ]
    except nvml.NVMLError as e:
        return Check("nvlink", "unknown", f"NVML error reading NVLink state: {e}", "check `nvidia-smi nvlink --status`")
    with_links = [i for i, n in links.items() if n]
    if not with_links:
        return Check("nvlink", "warn", f"PCIe: no NVLink on any of the {len(devices)} GPUs; gradient sync goes over PCIe",
                      "PCIe is adequate for smaller models; large models train faster on SXM GPUs with NVLink "
                      "(H100/H200 SXM5, B200)")
    if len(with_links) != len(devices):
        without = sorted(set(links) - set(with_links))
        return Check("nvlink", "fail", f"GPUs {without} have no NVLink while {with_links} do",
                      "check `nvidia-smi nvlink --status`; a GPU without links needs a reset or a hardware ticket")
    total = sum(links.values())
    bad = {i: ls for i, ls in down.items() if ls}
    per_gpu = sorted(set(links.values()))
    shape = f"SXM: NVLink on all {len(devices)} GPUs, {'/'.join(map(str, per_gpu))} links each"
    if bad:
        problems = "; ".join(
            f"GPU {i}: link{'s' if len(ls) > 1 else ''} {', '.join(map(str, ls))} down ({links[i] - len(ls)}/{links[i]} up)"
            for i, ls in sorted(bad.items())
        )
        gpus = " ".join(f"-i {i}" for i in bad)
        return Check("nvlink", "fail", f"{shape}, {total - sum(map(len, bad.values()))}/{total} up — {problems}",
                      f"`nvidia-smi nvlink --status {gpus}`; drain the GPU and reset it (nvidia-smi -r), and if the "
                      "link stays down open a hardware ticket; collectives through it are slower or fail")
    return Check("nvlink", "ok", f"{shape}, all {total} up")


def _cc(nvml: Any, handle: Any, name: str) -> tuple[tuple[int, int] | None, str]:
    try:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        return (int(major), int(minor)), "NVML"
    except (nvml.NVMLError, AttributeError):
        for key, cc in _CC_BY_NAME:
            if key in name:
                return cc, "model name"
    return None, ""


def check_bf16(ctx: DoctorContext) -> Check:
    got = _gpus(ctx, "bf16")
    if not isinstance(got, tuple):
        return got
    nvml, devices = got
    ccs: dict[int, tuple[int, int] | None] = {}
    source = set()
    try:
        for d in devices:
            ccs[d.index], how = _cc(nvml, nvml.nvmlDeviceGetHandleByIndex(d.index), d.name)
            source.add(how)
    except nvml.NVMLError as e:
        return Check("bf16", "unknown", f"NVML error: {e}", "check `nvidia-smi --query-gpu=compute_cap --format=csv`")
    unknown = [i for i, cc in ccs.items() if cc is None]
    if unknown:
        return Check("bf16", "unknown", f"no compute capability for GPUs {unknown}",
                      "check `nvidia-smi --query-gpu=compute_cap --format=csv`; BF16 needs 8.0 or newer")
    old = {i: cc for i, cc in ccs.items() if cc is not None and cc < (8, 0)}
    shown = ", ".join(sorted({f"{c[0]}.{c[1]}" for c in ccs.values() if c}))
    via = f" (from the {' and '.join(sorted(s for s in source if s))})"
    if old:
        return Check("bf16", "fail", f"GPUs {sorted(old)} have compute capability {shown}{via}: no native BF16",
                      "use fp16 with loss scaling (ds_config: bf16.enabled=false, fp16.enabled=true) or Ampere/Hopper/Blackwell GPUs")
    return Check("bf16", "ok", f"native BF16 on all {len(devices)} GPUs: compute capability {shown}{via}")


def kernel_driver_version(proc_root: Path) -> str | None:
    """The loaded kernel module's version (`/proc/driver/nvidia/version`), None when none is loaded."""
    try:
        text = (proc_root / "driver" / "nvidia" / "version").read_text()
    except OSError:
        return None
    m = _KERNEL_MODULE.search(text)
    return m.group(1) if m else "unknown"


_KERNEL_MODULE = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")


def check_driver(ctx: DoctorContext) -> Check:
    b = ctx.backend
    if b is None:
        return Check("driver", "unknown", "GPU backend not opened", "run spx doctor with --gpu-backend auto")
    kernel = None if b.kind == "fake" else kernel_driver_version(ctx.proc_root)
    if b.nvml is None:
        if kernel is None:
            return Check("driver", "warn", f"no NVIDIA driver loaded: {_reason(b)}",
                         "on a GPU host, install the NVIDIA datacenter driver (e.g. apt install "
                         "nvidia-driver-550-server) and reboot; `nvidia-smi` must list the GPUs")
        return Check("driver", "fail", f"kernel driver {kernel} is loaded, but NVML does not answer: {_reason(b)}",
                     f"install the NVML library of driver {kernel} (libnvidia-ml.so.1, e.g. the distribution's "
                     "nvidia-utils package) and check `nvidia-smi`")
    nvml = b.nvml
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        lib = _text(nvml.nvmlSystemGetNVMLVersion())
    except nvml.NVMLError as e:
        return Check("driver", "unknown", f"NVML error: {e}", "check `nvidia-smi`")
    detail = f"driver {driver}, NVML {lib}" + (" (fake backend)" if b.kind == "fake" else "")
    fix_reload = "reboot (or reload the nvidia modules) after a driver upgrade"
    if not lib.endswith(driver):
        return Check("driver", "fail", detail + ": NVML library and kernel driver versions differ", fix_reload)
    if kernel not in (None, "unknown", driver):
        return Check("driver", "fail", detail + f", but the loaded kernel module is {kernel}", fix_reload)
    return Check("driver", "ok", detail + ("" if kernel is None else f", kernel module {kernel}"))


def check_quarantine(state_dir: Path) -> Check:
    """GPUs the daemon's health gate quarantined (its store's table): never allocated until released."""
    path = state_dir / "spx.sqlite"
    if not path.exists():
        return Check("quarantine", "ok", "no state store yet: no GPU quarantined")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            rows = db.execute("SELECT gpu, reason FROM gpu_quarantine ORDER BY gpu").fetchall()
        finally:
            db.close()
    except sqlite3.Error as e:
        if "no such table" in str(e):
            return Check("quarantine", "ok", "no GPU quarantined")
        return Check("quarantine", "unknown", f"cannot read {path}: {e}", "run spx doctor as root (the store is root's)")
    if not rows:
        return Check("quarantine", "ok", "no GPU quarantined")
    listed = "; ".join(f"GPU {gpu}: {reason}" for gpu, reason in rows)
    first = rows[0][0]
    return Check("quarantine", "warn", f"{len(rows)} GPU{'s' * (len(rows) != 1)} quarantined ({listed})",
                 f"check the GPU (nvidia-smi -q -i {first}; a reset: nvidia-smi -r -i {first}), then spx gpu release {first}")
