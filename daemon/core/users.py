"""Who a uid is, as the daemon's answers and permission checks need it.

Every request names its caller by the kernel's uid (SO_PEERCRED, a spool file's owner); these
questions about it are asked by intake, the queue's controls and the control socket alike, and who
may read a job's logs by everything that writes them (attempt logs, their relay, staging).
"""

from __future__ import annotations

import grp
import pwd
from dataclasses import dataclass


def is_admin(uid: int, admin_group: str | None) -> bool:
    """Root, or a member (primary or supplementary) of the config's `admin_group`."""
    if uid == 0:
        return True
    if not admin_group:
        return False
    try:
        group = grp.getgrnam(admin_group)
        user = pwd.getpwuid(uid)
    except KeyError:
        return False
    return user.pw_gid == group.gr_gid or user.pw_name in group.gr_mem


def user_name(uid: int) -> str:
    """Who asked, as `spx status` shows it ("cancelled by alice"); the uid if the name is gone."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


@dataclass(frozen=True)
class LogAccess:
    """Who reads a job's logs besides root: the owner (`uid`, the files' owner), and the members of
    the group `gid` only when `group_reads` (the config's `log_group`). Never the owner's primary
    group as such: on hosts where everyone's primary group is `users`, that would be everyone."""

    uid: int = -1  # -1: leave the owner as created (no account to hand the files to)
    gid: int = -1
    group_reads: bool = False

    @property
    def file_mode(self) -> int:
        return 0o640 if self.group_reads else 0o600

    @property
    def dir_mode(self) -> int:
        return 0o750 if self.group_reads else 0o700


def log_access(uid: int, log_group: str | None) -> LogAccess:
    """The owner `uid` reads; so does `log_group` if set and it exists. A `log_group` that names no
    group gives it to nobody (the files stay the owner's alone) rather than guessing another."""
    try:
        primary = pwd.getpwuid(uid).pw_gid
    except KeyError:
        primary = -1
    if log_group:
        try:
            return LogAccess(uid, grp.getgrnam(log_group).gr_gid, group_reads=True)
        except KeyError:
            pass
    return LogAccess(uid, primary)
