"""A cheap job that leaves a ledger of its own runs, so a test can tell how often it really ran.

    counted.py LEDGER SECONDS EXIT_CODE [--flood] [--fail-first-run]

Each start appends one JSON line to LEDGER (O_APPEND, one write): the attempt number and id the daemon
gave it, its pid and GPUs, and which earlier runs of the same job were still alive at that moment (a job run
twice at once). Then it sleeps SECONDS (with --flood: writes to stdout as fast as it can instead),
appends an "end" line and exits with EXIT_CODE (with --fail-first-run: only the job's first run
does; later runs exit 0).
"""

from __future__ import annotations

import json
import os
import sys
import time


def alive_runs(ledger: str, job: str) -> list[str]:
    """Attempt ids of earlier starts of this job whose process still exists."""
    alive = []
    try:
        with open(ledger) as f:
            starts = [json.loads(ln) for ln in f if ln.strip()]
    except FileNotFoundError:
        return []
    for rec in starts:
        if rec["event"] != "start":
            continue
        try:
            with open(f"/proc/{rec['pid']}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if f"SPX_ATTEMPT_ID={rec['attempt_id']}".encode() in environ and f"SPX_JOB={job}".encode() in environ:
            alive.append(rec["attempt_id"])
    return alive


def record(ledger: str, rec: dict) -> None:
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(rec) + "\n").encode())
    finally:
        os.close(fd)


def main() -> int:
    ledger, seconds, code = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    job = os.environ["SPX_JOB"]
    ident = {"attempt": int(os.environ["SPX_ATTEMPT"]), "attempt_id": os.environ["SPX_ATTEMPT_ID"], "pid": os.getpid(),
             "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    if "--fail-first-run" in sys.argv and os.path.exists(ledger):
        code = 0
    record(ledger, {"event": "start", **ident, "time": time.time(), "concurrent_with": alive_runs(ledger, job)})
    print(f"started attempt {ident['attempt']}", flush=True)
    if "--flood" in sys.argv:
        line = b"flood " * 1000 + b"\n"
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                os.write(1, line)
            except BlockingIOError:
                pass
    else:
        time.sleep(seconds)
    record(ledger, {"event": "end", **ident, "time": time.time(), "code": code})
    return code


if __name__ == "__main__":
    sys.exit(main())
