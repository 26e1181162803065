"""Who a uid is, as the daemon's answers and permission checks need it.

Every request names its caller by the kernel's uid (SO_PEERCRED, a spool file's owner); these two
questions about it are asked by intake, the queue's controls and the control socket alike.
"""

from __future__ import annotations

import grp
import pwd


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
