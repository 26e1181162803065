"""The one-line summary systemd shows as `Status:` in `systemctl status spx-trainer`."""

from __future__ import annotations

from collections import Counter


def _ago(seconds: float) -> str:
    if seconds < 90:
        return f"{int(seconds)} s ago"
    if seconds < 5400:
        return f"{int(seconds // 60)} min ago"
    return f"{int(seconds // 3600)} h ago"


def format_status(
    jobs: list[tuple[str, list[int]]], gpus_total: int, last_restart: tuple[str, float, str] | None, now: float,
    store_problem: str | None = None, adopted: int = 0, drained: str | None = None,
) -> str:
    """E.g. "2 running, 1 queued, 6/8 GPUs busy; adopted 2 running jobs; llama-ft restarted 3 min ago
    (crash)" — "adopted N" while this daemon runs, for the attempts it found running when it started
    (after a crash, a watchdog kill or `systemctl reload`) and took on as they were — and, while the
    state store refuses writes, "; STATE STORE NOT WRITABLE: <why>" (jobs go on; writes are retried).
    While drained (`spx drain`), it starts with "DRAINED (by root at ...): no new starts; ".
    `jobs`: each live job's state and GPUs (`JobsTable.live_states`: no view is built for it)."""
    states = Counter(state for state, _gpus in jobs)
    parts = [f"{states.get('running', 0)} running"]
    for state in ("starting", "restarting", "queued"):
        if states.get(state):
            parts.append(f"{states[state]} {state}")
    busy = len({g for state, gpus in jobs if state in ("starting", "running", "restarting") for g in gpus})
    text = ", ".join(parts) + (f", {busy}/{gpus_total} GPUs busy" if gpus_total else ", no GPUs (CPU jobs only)")
    if adopted:
        text += f"; adopted {adopted} running job{'' if adopted == 1 else 's'}"
    if last_restart is not None:
        name, when, why = last_restart
        text += f"; {name} restarted {_ago(max(0.0, now - when))} ({why})"
    if store_problem:
        text += f"; STATE STORE NOT WRITABLE: {store_problem}"
    if drained:
        text = f"DRAINED ({drained}): no new starts; " + text
    return text
