"""The value every `spx doctor` check returns (a leaf module, so the check modules share it)."""

from __future__ import annotations

from dataclasses import dataclass

STATUSES = ("ok", "fail", "warn", "unknown")
SYMBOL = {"ok": "✓", "fail": "✗", "warn": "!", "unknown": "?"}


@dataclass(frozen=True)
class Check:
    """One line of the report. `fix` is empty for "ok" and says what to do otherwise."""

    name: str
    status: str
    detail: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {self.status!r}")
        if self.status != "ok" and not self.fix:
            raise ValueError(f"check {self.name!r} is {self.status} but says no fix")
