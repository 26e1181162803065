"""`spx incidents [NAME]`: one record per failed attempt — what broke (class, root cause, first
rank), on which GPUs, what the kernel and the GPUs said in the minute before, the stacks of a
hang, and how the recovery went (phases, restart seconds).

    spx incidents            # every job of yours (an admin: everyone's), the latest 200
    spx incidents NAME       # that job's (its latest of that name)
    spx incidents --json     # the documents (docs/incidents.md has their shape)

Asked of the daemon over the control socket; with no daemon, root reads the store.
"""

from __future__ import annotations

import argparse
import json
import time

from spx.daemon.cli.client import EXIT_OK, ask
from spx.daemon.core.config import DaemonConfig

MAX_STACK_LINES = 60  # in the text view; --json has them all


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="the job's name (default: every job you may see)")
    parser.add_argument("--json", action="store_true", help="the incidents as JSON (docs/incidents.md has their shape)")


def cmd_incidents(cfg: DaemonConfig, args: argparse.Namespace) -> int:
    found = ask(cfg, "incidents", args.name)
    assert isinstance(found, list)
    if args.json:
        print(json.dumps(found, indent=1))
    elif not found:
        print(f"{args.name}: no incidents" if args.name else "no incidents")
    else:
        print("\n\n".join("\n".join(render(i)) for i in found))
    return EXIT_OK


def clock(t: float | None) -> str:
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1000):03d}"


def reading_line(r: dict) -> str:
    """One GPU reading in words: what an operator scans for (load, memory, power, heat, clocks, throttling)."""
    parts = []
    if r.get("up") == 0:
        return "lost (NVML: GPU is lost)"
    if "utilization" in r:
        parts.append(f"util {r['utilization'] * 100:.0f}%")
    if "memory_used_bytes" in r:
        parts.append(f"mem {r['memory_used_bytes'] / 2**30:.1f}G")
    if "power_watts" in r:
        parts.append(f"{r['power_watts']:.0f} W")
    if "temperature_celsius" in r:
        parts.append(f"{r['temperature_celsius']:.0f} °C")
    if "sm_clock_hertz" in r:
        parts.append(f"SM {r['sm_clock_hertz'] / 1e6:.0f} MHz")
    throttles = sorted(k.removeprefix("throttle_") for k in r if k.startswith("throttle_"))
    if throttles:
        parts.append("throttle: " + ",".join(throttles))
    for key in ("ecc_uncorrected", "ecc_corrected"):
        if r.get(key):
            parts.append(f"{key.replace('_', ' ')} {r[key]:.0f}")
    nvlink = {k: v for k, v in r.items() if k.startswith("nvlink_") and v}
    if nvlink:
        parts.append("NVLink errors " + ",".join(f"{k[7:-7]} {v:.0f}" for k, v in sorted(nvlink.items())))
    return "  ".join(parts)


def render(i: dict) -> list[str]:
    failed = i.get("failed_at")
    lines = [f"{i['job']}  attempt {i['attempt']}  {i.get('class') or '-'}  {clock(failed)}",
             f"  reason:      {i.get('reason') or '-'}"]
    if i.get("root_cause"):
        lines.append(f"  root cause:  {i['root_cause']}")
    for g in i.get("gpus", []):
        lines.append(f"  GPU {g['index']}  {g.get('uuid') or ''}  {g.get('pci_bus_id') or ''}".rstrip())
        lines += [f"    {x['what']} at {clock(x['time'])}" for x in g.get("xids", [])]
        lines += [f"    kernel: {k}" for k in g.get("kernel", [])]
        readings = g.get("readings", [])
        if readings:
            lines.append(f"    {len(readings)} readings in the {i.get('readings_seconds', 60):.0f} s before; "
                         f"the last ({failed - readings[-1]['time']:.1f} s before): {reading_line(readings[-1])}"
                         if isinstance(failed, (int, float)) else f"    {len(readings)} readings")
        else:
            lines.append("    no readings in the minute before (nothing scraped /metrics)")
    kernel = i.get("kernel_log") or {}
    if kernel.get("unavailable"):
        lines.append(f"  kernel log: {kernel['unavailable']}")
    if i.get("stacks"):
        stack = i["stacks"].splitlines()
        lines.append("  stacks:")
        lines += [f"    {s}" for s in stack[:MAX_STACK_LINES]]
        if len(stack) > MAX_STACK_LINES:
            lines.append(f"    … {len(stack) - MAX_STACK_LINES} more lines (--json)")
    if i.get("recovery"):
        lines.append("  recovery:    " + ", ".join(
            f"{p['phase']} {p['time'] - failed:+.2f} s" if isinstance(failed, (int, float)) else p["phase"]
            for p in i["recovery"]))
    restart = i.get("restart_seconds")
    lines.append(f"  restart:     {'-' if restart is None else f'{restart:.2f} s'} (to the next attempt's first step)")
    return lines
