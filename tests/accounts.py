"""A uid this host has no account for: the owner of a job whose user was removed meanwhile. A plain
helper (asks NSS, as the daemon does; creates no user), for tests with and without real users.
"""

from __future__ import annotations

import pwd


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def uid_without_account() -> int:
    """The first uid from 61000 (above the ranges useradd gives out) that names no account here."""
    return next(u for u in range(61000, 62000) if not _has_account(u))
