"""Become the job's owner: the one privilege drop every helper process of the daemon uses.

stdlib only, so a helper run by an interpreter without the daemon's dependencies (the copier under a
system python) can import it. Helpers start as root — the interpreter may be unreadable to the user
(a pyenv under /root) — import everything they need, then call `become` before touching any path.
"""

from __future__ import annotations

import os
from typing import Any


def become(ids: dict[str, Any] | None) -> None:
    """Turn this process into the user `ids` names ({"uid", "gid", "groups"}; None: stay as is),
    irreversibly: supplementary groups first, then gid, then uid — real, effective and saved alike."""
    if ids is None:
        return
    os.setgroups([int(g) for g in ids["groups"]])
    os.setresgid(int(ids["gid"]), int(ids["gid"]), int(ids["gid"]))
    os.setresuid(int(ids["uid"]), int(ids["uid"]), int(ids["uid"]))
