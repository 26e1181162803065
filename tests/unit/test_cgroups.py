"""cgroups.py without a cgroup of its own: finding a process's cgroup from mountinfo (services,
hybrid hosts, containers) and what `manage` refuses before it touches anything. The real cgroup v2
of this machine, with processes in it: tests/processes/test_cgroups_live.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spx.daemon.run import cgroups

MOUNTINFO = Path("/proc/self/mountinfo").read_text()


def test_own_cgroup_of_a_service_with_protectcontrolgroups_and_a_writable_delegated_subtree():
    # /proc/self/mountinfo of a unit with ProtectControlGroups=yes and ReadWritePaths= on its own cgroup
    # (systemd 252 in tests/systemd): the read-only mount of the whole tree comes first.
    mountinfo = (
        "122 121 0:38 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime shared:18 - cgroup2 cgroup2 rw\n"
        "129 122 0:38 /system.slice/x.service /sys/fs/cgroup/system.slice/x.service rw,relatime - cgroup2 cgroup2 rw\n"
    )
    own = cgroups.own_cgroup(mountinfo, "0::/system.slice/x.service\n")
    assert own == Path("/sys/fs/cgroup/system.slice/x.service")
    assert not cgroups.is_root(own, mountinfo), "a bind mount of the unit's own cgroup is not the root"
    assert cgroups.is_root(Path("/sys/fs/cgroup"), mountinfo)


def test_own_cgroup_on_a_hybrid_host_and_in_a_container_mount_rooted_below_the_namespace():
    hybrid = ("35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
              "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
    assert cgroups.own_cgroup(hybrid, "4:memory:/x\n0::/a/b\n") == Path("/sys/fs/cgroup/unified/a/b")
    rooted = "50 40 0:38 /lxc/c1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert cgroups.own_cgroup(rooted, "0::/lxc/c1/init.scope\n") == Path("/sys/fs/cgroup/init.scope")
    assert cgroups.own_cgroup(rooted, "0::/elsewhere\n") is None
    assert cgroups.own_cgroup("35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n", "4:memory:/\n") is None


def test_on_refuses_the_root_cgroup_and_a_missing_hierarchy_before_touching_anything():
    roots = [Path(ln.partition(" - ")[0].split()[4]) for ln in MOUNTINFO.splitlines()
             if ln.partition(" - ")[2].startswith("cgroup2 ")]
    for root in roots:
        with pytest.raises(cgroups.CgroupError, match="root cgroup"):
            cgroups.manage("on", root, MOUNTINFO, os.getpid())
        assert cgroups.manage("auto", root, MOUNTINFO, os.getpid())[0] is None
    with pytest.raises(cgroups.CgroupError, match="Delegate=yes"):
        cgroups.manage("on", None, MOUNTINFO, os.getpid())
