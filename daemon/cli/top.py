"""`spx top` / `spx status NAME --watch`: a live terminal view of jobs and GPUs, redrawn in place.

    spx top            # every second until Ctrl-C
    spx top --once     # one frame, plain text (also what a pipe or a file gets)

`render()` is pure (jobs, GPU rows, time, width → text) so the layout is unit-tested; `run_top()`
owns the terminal: home the cursor, overwrite each line, clear what is left, hide the cursor while
it runs and give it back on Ctrl-C, SIGTERM or SIGHUP. The GPU rows come from the daemon
(`service/gpu_rows.py`): the GPUs it uses, with its allocation.
"""

from __future__ import annotations

import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from spx.daemon.service.gpu_rows import ACTIVE_STATES, GpuRow
from spx.daemon.state.views import JobView

GIB = 1 << 30
HOME, CLEAR_EOL, CLEAR_BELOW, CLEAR_ALL = "\x1b[H", "\x1b[K", "\x1b[J", "\x1b[2J"
HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"


# --- formatting -----------------------------------------------------------------------------------


def age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def gpu_list(indices: Sequence[int]) -> str:
    """[0,1,2,3,6] → "0-3,6"."""
    out: list[str] = []
    for i in sorted(indices):
        if out and (prev := out[-1].split("-")[-1]).isdigit() and int(prev) == i - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ",".join(out)


def restarts(job: JobView) -> int:
    return sum(job.restarts_by_reason.values()) if job.restarts_by_reason else max(0, job.attempts - 1)


def _num(v: float | None, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]], right: set[int], width: int,
           shrink: int) -> list[str]:
    """Align columns; if the table is wider than `width`, narrow column `shrink`, then clip lines."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    over = sum(widths) + 2 * (len(widths) - 1) - width
    if over > 0:
        widths[shrink] = max(len(header[shrink]), widths[shrink] - over)

    def fit(cell: str, i: int) -> str:
        if len(cell) > widths[i]:
            cell = cell[: max(1, widths[i] - 1)] + "…"
        return cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])

    lines = ["  ".join(fit(c, i) for i, c in enumerate(r)).rstrip() for r in [header, *rows]]
    return [line[:width] for line in lines]


def _natural_width(header: tuple[str, ...], rows: Sequence[tuple[str, ...]], keep: list[int]) -> int:
    return sum(max(len(r[i]) for r in [header, *rows]) for i in keep) + 2 * (len(keep) - 1)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


MIN_NOTE_WIDTH = 24


def render(jobs: list[JobView], gpus: list[GpuRow], now: float, width: int, drained: str | None = None) -> str:
    """One frame: a summary line (and, while the host is drained, a line saying so), the jobs table,
    the GPUs table.

    Each job's note (staging progress, or why it is in its state) goes in a last column when the
    terminal has room for it, else on its own line under the job, so it is never cut to nothing.
    """
    states: dict[str, int] = {}
    for j in jobs:
        states[j.state] = states.get(j.state, 0) + 1
    busy = sum(1 for g in gpus if g.job)
    summary = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "no jobs"
    gpu_s = f"{len(gpus)} GPUs, {busy} allocated" if gpus else "no GPUs"
    lines = [_clip(f"spx top  {time.strftime('%H:%M:%S', time.localtime(now))}  {summary} · {gpu_s}", width), ""]
    if drained:
        lines.insert(1, _clip(f"! DRAINED ({drained}): no new job starts; running jobs go on (spx undrain)", width))

    ordered = sorted(jobs, key=lambda j: (j.state not in ACTIVE_STATES, j.name))
    job_rows = []
    for j in ordered:
        ckpt = ""
        if j.last_checkpoint_step is not None:
            when = age(now - j.last_checkpoint_time) if j.last_checkpoint_time is not None else "?"
            ckpt = f"{when} (step {j.last_checkpoint_step})"
        job_rows.append((
            j.name, j.state, _num(j.step, ","), _num(j.samples_per_second, ",.1f"), ckpt,
            str(restarts(j)), gpu_list(j.gpus),
        ))
    header = ("JOB", "STATE", "STEP", "SAMPLES/S", "LAST CKPT", "RESTARTS", "GPUS")
    keep = list(range(len(header)))
    # Too narrow: drop what is shown elsewhere or matters least (GPUs are in the GPU table) before
    # cutting job names.
    for drop in (6, 5, 3, 4):
        if _natural_width(header, job_rows, keep) <= width:
            break
        keep.remove(drop)
    right = {keep.index(i) for i in (2, 3, 5) if i in keep}
    table = _table(tuple(header[i] for i in keep), [tuple(r[i] for i in keep) for r in job_rows], right, width, shrink=0)
    notes = [j.staging or j.reason or "" for j in ordered]
    col = max(len(line) for line in table) + 2
    inline = width - col >= MIN_NOTE_WIDTH
    if inline and any(notes):
        table[0] = table[0].ljust(col) + "NOTE"
    lines.append(table[0])
    for row, note in zip(table[1:], notes, strict=True):
        if note and inline:
            lines.append(row.ljust(col) + _clip(note, width - col))
        else:
            lines.append(row)
            if note:
                lines.append(_clip(f"  └ {note}", width))
    if not job_rows:
        lines.append("(no jobs)")
    lines.append("")

    gpu_table = []
    for g in gpus:
        mem = ""
        if g.memory_total:
            used = f"{g.memory_used / GIB:.1f}" if g.memory_used is not None else "?"
            mem = f"{used}/{g.memory_total / GIB:.1f} GiB"
        util = "" if g.utilization is None else f"{g.utilization}%"
        power = "" if g.power_watts is None else f"{g.power_watts:.0f} W"
        gpu_table.append((str(g.index), g.name.removeprefix("NVIDIA "), util, mem, power, g.job or ""))
    if gpu_table:
        lines += _table(("GPU", "NAME", "UTIL", "MEMORY", "POWER", "JOB"), gpu_table, {0, 2, 3, 4}, width, shrink=1)
    for g in gpus:  # never allocated until an operator releases it: said under the table
        if g.quarantine:
            lines.append(_clip(f"! GPU {g.index} quarantined: {g.quarantine} (spx gpu release {g.index})", width))
    return "\n".join(lines) + "\n"


# --- the loop -------------------------------------------------------------------------------------

# Jobs, GPU rows and, optionally, the drain (who drained the host, or None).
Fetch = Callable[[], tuple[list[JobView], list[GpuRow]] | tuple[list[JobView], list[GpuRow], str | None]]


def _frame(fetch: Fetch, now: float, width: int) -> str:
    jobs, gpus, *drained = fetch()
    return render(jobs, gpus, now, width, drained[0] if drained else None)


def run_top(
    fetch: Fetch,
    interval: float = 1.0,
    out: TextIO = sys.stdout,
    *,
    once: bool = False,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    max_frames: int | None = None,
) -> int:
    """Redraw until Ctrl-C (returns 0). Not a terminal, or `once`: print one plain frame and return.

    In the live view a failing `fetch` (say, the daemon restarting) shows its error in the frame and
    is retried next tick; with `once` it propagates, so the CLI exits non-zero with the message.
    """
    if once or not out.isatty():
        size = shutil.get_terminal_size((120, 40))
        out.write(_frame(fetch, clock(), size.columns))
        out.flush()
        return 0
    frames = 0
    out.write(HIDE_CURSOR + CLEAR_ALL)
    restore = _exit_on_terminate()
    try:
        while max_frames is None or frames < max_frames:
            size = shutil.get_terminal_size((120, 40))
            try:
                text = _frame(fetch, clock(), size.columns)
            except Exception as e:  # noqa: BLE001 - shown in the frame, retried next tick
                text = f"spx top: {type(e).__name__}: {e} (retrying every {interval:g} s)\n"
            lines = text.splitlines()[: max(1, size.lines - 1)]
            out.write(HOME + "".join(line + CLEAR_EOL + "\n" for line in lines) + CLEAR_BELOW)
            out.flush()
            frames += 1
            if max_frames is None or frames < max_frames:
                sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        restore()
        out.write(SHOW_CURSOR)
        out.flush()
    return 0


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # as a shell reports a process the signal killed


def _exit_on_terminate() -> Callable[[], None]:
    """While the live view runs, SIGTERM and SIGHUP (`kill`, a closed terminal) exit through the
    `finally` that gives the cursor back, instead of killing spx with the cursor hidden. Returns
    what puts the previous handlers back. Signal handlers belong to the main thread: elsewhere
    (a caller's thread) nothing is changed."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    before = {sig: signal.signal(sig, _terminated) for sig in (signal.SIGTERM, signal.SIGHUP)}

    def restore() -> None:
        for sig, handler in before.items():
            signal.signal(sig, handler)

    return restore
