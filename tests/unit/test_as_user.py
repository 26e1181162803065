"""as_user.owner without a process or a user of its own: an owner whose account is gone is a clear
error (the rest of as_user, with real users, is in tests/processes/test_fsafe_users.py)."""

from __future__ import annotations

import pytest
from accounts import uid_without_account

from spx.daemon.userfs import as_user
from spx.daemon.userfs.fsafe import UserPathError


def test_an_owner_without_an_account_is_a_clear_error():
    free = uid_without_account()
    with pytest.raises(UserPathError, match=f"uid {free}.*no account"):
        as_user.owner(free)
