"""`spx logs NAME`: an attempt's log, printed as the invoking user reads it (`-f` follows the running
attempt to its end); an earlier job of a reused name by its id, from where the daemon set its logs
aside (`log/NAME.job-ID`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from spx.daemon.cli.client import EXIT_OK, CliError, ask
from spx.daemon.core.config import DaemonConfig


def cmd_logs(cfg: DaemonConfig, args: argparse.Namespace) -> int:
    doc = ask(cfg, "status", args.name)
    assert isinstance(doc, dict)
    current = args.job_id is None or args.job_id == doc.get("job_id")
    log_dir = cfg.log_dir / args.name if current else _earlier_log_dir(cfg, args.name, args.job_id)
    if not current and not log_dir.is_dir():
        raise CliError(f"no logs of a job {args.job_id} named {args.name} (looked for {log_dir}); "
                       f"the ids are in `spx ls --all`")
    number = args.attempt or (doc["attempts"] if current else _attempts_in(log_dir))
    if not number:
        raise CliError(f"{args.name} has not started an attempt yet")
    path = log_dir / f"attempt-{number}.log"
    try:
        f = path.open("rb")
    except OSError as e:
        raise CliError(_missing_log_message(cfg, args.name, doc, path, e) if current else f"{path}: {e.strerror}") from e
    with f:
        while True:
            chunk = f.read(65536)
            if chunk:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
                continue
            if not args.follow or not current:
                return EXIT_OK
            now = ask(cfg, "status", args.name)
            assert isinstance(now, dict)
            if now["state"] in ("succeeded", "failed", "cancelled") or now["attempts"] != number:
                return EXIT_OK
            time.sleep(0.5)


def _earlier_log_dir(cfg: DaemonConfig, name: str, job_id: int) -> Path:
    """Where the daemon moved an earlier job's logs when its name was reused (`log/NAME.job-ID`)."""
    return cfg.log_dir / f"{name}.job-{job_id}"


def _attempts_in(log_dir: Path) -> int:
    try:
        return max((int(p.stem.removeprefix("attempt-")) for p in log_dir.glob("attempt-*.log")
                    if p.stem.removeprefix("attempt-").isdigit()), default=0)
    except OSError:
        return 0


def _missing_log_message(cfg: DaemonConfig, name: str, doc: dict, path: Path, e: OSError) -> str:
    """A missing attempt log, with where the earlier jobs of a reused name keep theirs."""
    message = f"{path}: {e.strerror}; job {doc.get('job_id', '?')} named {name} has {doc['attempts']} attempt(s)"
    earlier = []
    for d in sorted(cfg.log_dir.glob(f"{name}.job-*")):
        job_id = d.name.removeprefix(f"{name}.job-")
        if job_id.isdigit():
            earlier.append(f"job {job_id}: {d} ({_attempts_in(d)} attempt(s))")
    if earlier:
        message += (f"\nearlier jobs named {name} keep their logs aside: " + "; ".join(earlier)
                    + f"\nread one with `spx logs {name} --job-id ID --attempt N` (ids: `spx ls --all`)")
    return message
