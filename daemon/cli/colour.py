"""Colour in `spx`'s text for a person: job states (`spx ls`, `status`, `history`) and doctor's
verdicts, when stdout is a terminal.

    --color auto (default): only on a terminal, and not when NO_COLOR is set to anything but ""
                            (no-color.org) or TERM is "dumb"
    --color always:         even into a pipe (`spx ls --color=always | less -R`); overrides NO_COLOR
    --color never:          plain text

`--json` output is never painted. Colours mark words in cells already padded to their width, so a
painted table lines up as the plain one does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TextIO

MODES = ("auto", "always", "never")
RESET = "\x1b[0m"
GREEN, YELLOW, RED, BLUE, DIM, BOLD_RED = "\x1b[32m", "\x1b[33m", "\x1b[31m", "\x1b[34m", "\x1b[2m", "\x1b[1;31m"
STATE_COLOURS = {
    "running": GREEN, "succeeded": GREEN, "starting": BLUE, "queued": YELLOW, "restarting": YELLOW,
    "failed": BOLD_RED, "cancelled": DIM,
}
# spx doctor's verdicts (doctor/check.py STATUSES).
CHECK_COLOURS = {"ok": GREEN, "warn": YELLOW, "fail": BOLD_RED, "unknown": DIM}


def wanted(mode: str, stream: TextIO, env: Mapping[str, str] = os.environ) -> bool:
    """Whether to paint what goes to `stream` under `--color MODE`."""
    if mode == "always":
        return True
    if mode == "never" or env.get("NO_COLOR", "") != "" or env.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


@dataclass(frozen=True)
class Paint:
    """Wraps text in the colour of a state or verdict, or leaves it alone when `on` is False."""

    on: bool = False

    def state(self, text: str, state: str | None = None) -> str:
        """`text` (a job state, maybe padded) in that state's colour; `state` when text is not the word."""
        return self._wrap(text, STATE_COLOURS.get((state or text).strip()))

    def check(self, text: str, status: str) -> str:
        return self._wrap(text, CHECK_COLOURS.get(status))

    def _wrap(self, text: str, colour: str | None) -> str:
        return f"{colour}{text}{RESET}" if self.on and colour else text


PLAIN = Paint(False)
