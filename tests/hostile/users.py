"""Real local users for the hostile-input tests (docs/security.md, "Threats tested"): created with useradd
when missing, removed again by whoever created them. Two users and a group: `owner` submits jobs and
plays the attacker, `victim` has a private (0700) home, `group` holds `owner` as a supplementary
member."""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import subprocess
from collections.abc import Iterator

OWNER = "spx-hostile-a"
VICTIM = "spx-hostile-b"
GROUP = "spx-hostile-g"


def _ensure_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return False
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True, capture_output=True)
        return True


@contextlib.contextmanager
def hostile_users() -> Iterator[tuple[pwd.struct_passwd, pwd.struct_passwd, grp.struct_group]]:
    """(owner, victim, group): owner is a supplementary member of group; victim's home is 0700."""
    made = [n for n in (OWNER, VICTIM) if _ensure_user(n)]
    made_group = False
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        subprocess.run(["groupadd", GROUP], check=True, capture_output=True)
        made_group = True
    subprocess.run(["usermod", "-aG", GROUP, OWNER], check=True, capture_output=True)
    victim = pwd.getpwnam(VICTIM)
    os.chmod(victim.pw_dir, 0o700)
    try:
        yield pwd.getpwnam(OWNER), victim, grp.getgrnam(GROUP)
    finally:
        for name in made:
            subprocess.run(["userdel", "-r", name], check=False, capture_output=True)
        if made_group:
            subprocess.run(["groupdel", GROUP], check=False, capture_output=True)


def run_as(user: pwd.struct_passwd, argv: list[str], **kw) -> subprocess.CompletedProcess:
    """argv as `user` (with their supplementary groups), the way an attacker's shell runs it."""
    groups = os.getgrouplist(user.pw_name, user.pw_gid)
    return subprocess.run(argv, user=user.pw_uid, group=user.pw_gid, extra_groups=groups, cwd="/",
                          capture_output=True, text=True, **kw)
