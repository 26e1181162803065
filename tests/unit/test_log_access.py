"""Who reads a job's logs: the owner alone unless the config names a `log_group` (never the owner's
primary group as such, which on many hosts is everyone's `users`)."""

from __future__ import annotations

import grp
import os
import pwd

from spx.daemon.core.config import DaemonConfig, load_config
from spx.daemon.core.users import LogAccess, log_access


def _me() -> pwd.struct_passwd:
    return pwd.getpwuid(os.getuid())


def test_without_a_log_group_only_the_owner_reads():
    me = _me()
    access = log_access(me.pw_uid, None)
    assert access == LogAccess(me.pw_uid, me.pw_gid, group_reads=False)
    assert (access.file_mode, access.dir_mode) == (0o600, 0o700)


def test_a_log_group_reads_with_its_own_gid():
    me = _me()
    group = grp.getgrgid(os.getgid())
    access = log_access(me.pw_uid, group.gr_name)
    assert access == LogAccess(me.pw_uid, group.gr_gid, group_reads=True)
    assert (access.file_mode, access.dir_mode) == (0o640, 0o750)


def test_a_log_group_that_is_no_group_gives_no_one_else_access():
    names = {g.gr_name for g in grp.getgrall()}
    missing = next(f"spx-no-group-{i}" for i in range(1000) if f"spx-no-group-{i}" not in names)
    assert log_access(os.getuid(), missing) == log_access(os.getuid(), None)


def test_an_owner_without_an_account_keeps_the_files_group():
    taken = {p.pw_uid for p in pwd.getpwall()}
    free = next(u for u in range(61000, 62000) if u not in taken)
    assert log_access(free, None) == LogAccess(free, -1, group_reads=False)


def test_log_group_is_a_config_key(tmp_path):
    (tmp_path / "config.yaml").write_text("log_group: ml-readers\n")
    assert load_config(tmp_path / "config.yaml", tmp_path / "root").log_group == "ml-readers"
    assert DaemonConfig.rooted(tmp_path / "root").log_group is None, "unset by default: the owner alone"
