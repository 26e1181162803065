"""Which jobs `spx ls` and `spx history` show: `--me`, `--user NAME`, `--state STATE` (both repeatable
or comma-separated), and history's `--since`.

    spx ls --me                           # my jobs (an admin sees everyone's otherwise)
    spx ls --user alice,bob --state running,queued
    spx history --since 7d                # or 12h, 30m, 2w, 2024-05-01, 2024-05-01T09:30, all

The daemon already shows a user only their own jobs (root and the admin group: all); these narrow
what it answered, on the client, for the text and the `--json` alike.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Callable
from datetime import datetime

from spx.daemon.state.states import JobState

STATES = tuple(s.value for s in JobState)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")


def _words(text: str) -> list[str]:
    return [w.strip() for w in text.split(",") if w.strip()]


def state_list(text: str) -> list[str]:
    """`--state running,failed`: each a job state."""
    words = _words(text)
    unknown = [w for w in words if w not in STATES]
    if unknown or not words:
        raise argparse.ArgumentTypeError(f"{text!r}: the states are {', '.join(STATES)}")
    return words


def user_list(text: str) -> list[str]:
    words = _words(text)
    if not words:
        raise argparse.ArgumentTypeError("give a user name (or several, comma-separated)")
    return words


def since_seconds(text: str, now: float) -> float:
    """`--since` as Unix seconds: `all` (0), an age (`90s`, `30m`, `12h`, `7d`, `2w`: that long before
    `now`), or a local date or date and time (`2024-05-01`, `2024-05-01T09:30`, `2024-05-01 09:30`)."""
    text = text.strip()
    if text == "all":
        return 0.0
    ago = _AGO.match(text)
    if ago:
        return now - float(ago.group(1)) * _UNITS[ago.group(2)]
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: an age (30m, 12h, 7d, 2w), a date (2024-05-01), a date and time (2024-05-01T09:30) "
            "or all") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--me`, `--user`, `--state` on `parser`."""
    parser.add_argument("--me", action="store_true", help="only your own jobs (what root and admins see is everyone's)")
    parser.add_argument("--user", action="append", type=user_list, metavar="NAME",
                        help="only jobs of these owners (names or uids); repeatable or comma-separated")
    parser.add_argument("--state", action="append", type=state_list, metavar="STATE",
                        help=f"only jobs in these states ({', '.join(STATES)}); repeatable or comma-separated")


def selects(args: argparse.Namespace, uid: int | None = None) -> Callable[[dict], bool]:
    """A predicate over `ls --json` / `history --json` entries for the filters in `args`."""
    me = (os.getuid() if uid is None else uid) if getattr(args, "me", False) else None
    users = {u for group in getattr(args, "user", None) or [] for u in group}
    states = {s for group in getattr(args, "state", None) or [] for s in group}

    def keep(doc: dict) -> bool:
        if me is not None and doc.get("owner_uid") != me:
            return False
        if users and doc.get("owner") not in users and str(doc.get("owner_uid")) not in users:
            return False
        return not states or doc.get("state") in states

    return keep


def since_argument(text: str) -> float:
    """argparse's `type` for `--since`, against the clock now."""
    return since_seconds(text, time.time())


def select(docs: object, args: argparse.Namespace) -> list[dict]:
    """The entries of a daemon's list answer (`ls`, `history`, `accounting`) the filters keep."""
    assert isinstance(docs, list)
    keep = selects(args)
    return [d for d in docs if keep(d)]
