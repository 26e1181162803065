"""as_user.owner without a process or a user of its own: an owner whose account is gone is a clear
error (the rest of as_user, with real users, is in tests/processes/test_fsafe_users.py)."""

from __future__ import annotations

import pwd

import pytest

from spx.daemon.userfs import as_user
from spx.daemon.userfs.fsafe import UserPathError


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def test_an_owner_without_an_account_is_a_clear_error():
    free = next(u for u in range(61000, 62000) if not _has_account(u))
    with pytest.raises(UserPathError, match=f"uid {free}.*no account"):
        as_user.owner(free)
