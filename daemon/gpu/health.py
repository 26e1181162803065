"""The GPU health gate: is a GPU fit to be given to an attempt? Asked through the daemon's backend
(real NVML or the fake) before an attempt starts on its GPUs (the scheduler's `idle(g)`), so a GPU
that failed while a job ran on it — or while it sat idle — is caught before it is used again.

A GPU fails the gate when NVML says it is lost (GPU_IS_LOST: fallen off the bus; RESET_REQUIRED), a
row remap failed or is pending (the memory needs a reset before it can be trusted), its uncorrectable
ECC count rose since the last check, or an NVLink link that was up at the last check is down. The
first check of a GPU only takes its baseline (links down and ECC counts from before the daemon
started are the host's, not news). Fatal XIDs are events, not states: the daemon's XID listener
reports those that hit a GPU of a running attempt (`fatal_xid`), and the daemon quarantines that GPU.

A quarantined GPU is recorded in the store (its reason, its time) and never allocated until an
operator releases it (`spx gpu release N`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Fatal XIDs: the GPU (or its memory, or its links) cannot be trusted until it is reset.
FATAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "row remapping event",
    64: "row remapping failure",
    74: "NVLink error",
    79: "GPU fell off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def fatal_xid(xid: int) -> str | None:
    """What a fatal XID means, in words; None for an XID that does not make a GPU unusable."""
    return FATAL_XIDS.get(xid)


def xid_reason(gpu: int, xid: int) -> str:
    return f"XID {xid} on GPU {gpu} ({FATAL_XIDS.get(xid, 'XID error')})"


@dataclass(frozen=True)
class Sample:
    """What the gate compares between checks of one GPU."""

    ecc_uncorrected: int | None
    links_up: frozenset[int]


class HealthGate:
    """Per-GPU baselines and the check. Used on the daemon's main loop only (not thread-safe)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._last: dict[int, Sample] = {}

    def check(self, gpu: int) -> str | None:
        """Why GPU `gpu` must not be used (one line), or None if it passes."""
        nvml = self.backend.nvml
        if nvml is None:
            return None
        try:
            handle = self.backend.handle(gpu)
            nvml.nvmlDeviceGetMemoryInfo(handle)
        except IndexError:
            return f"GPU {gpu} is not on this host"
        except nvml.NVMLError as err:
            if err.value in (nvml.NVML_ERROR_GPU_IS_LOST, nvml.NVML_ERROR_RESET_REQUIRED):
                return f"GPU {gpu} lost: NVML says {err}"
            return None  # NVML cannot say now (a timeout, an unknown error): not free, not condemned
        problems = []
        remap = _call(nvml, nvml.nvmlDeviceGetRemappedRows, handle)
        if remap is not None:
            _, _, pending, failure = remap
            if failure:
                problems.append(f"row remapping failed on GPU {gpu}")
            elif pending:
                problems.append(f"row remap pending on GPU {gpu} (needs a reset)")
        ecc = _call(nvml, nvml.nvmlDeviceGetTotalEccErrors, handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    nvml.NVML_VOLATILE_ECC)
        links = frozenset(link for link in range(nvml.NVML_NVLINK_MAX_LINKS)
                          if _call(nvml, nvml.nvmlDeviceGetNvLinkState, handle, link) == nvml.NVML_FEATURE_ENABLED)
        sample = Sample(None if ecc is None else int(ecc), links)
        before = self._last.get(gpu)
        self._last[gpu] = sample
        if before is not None:
            if before.ecc_uncorrected is not None and sample.ecc_uncorrected is not None \
                    and sample.ecc_uncorrected > before.ecc_uncorrected:
                problems.append(f"uncorrectable ECC errors on GPU {gpu} rose from {before.ecc_uncorrected} "
                                f"to {sample.ecc_uncorrected}")
            down = sorted(before.links_up - sample.links_up)
            if down:
                problems.append(f"NVLink link{'s' if len(down) > 1 else ''} {', '.join(map(str, down))} "
                                f"of GPU {gpu} went down")
        return "; ".join(problems) or None


def _call(nvml: Any, fn: Any, *args: Any) -> Any:
    """An optional query: None where the GPU does not support it or NVML errs on it (not a fault)."""
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None
