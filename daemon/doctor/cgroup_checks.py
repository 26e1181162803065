"""`spx doctor`'s `cgroups` check: may the daemon put each attempt in a cgroup of its own (the one
container no job process can leave; run/cgroups.py)? Only where cgroup v2 is mounted and its own
cgroup is delegated to it: systemd's `Delegate=yes` on the unit (marked by the `user.delegate`
xattr), or the operator's `cgroups: on`. Elsewhere the daemon still runs, finding job processes by
tag and process group, which a process that leaves its session and scrubs its environment escapes."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from spx.daemon.doctor.check import Check
from spx.daemon.run import cgroups

if TYPE_CHECKING:
    from spx.daemon.doctor.report import DoctorContext

NAME = "cgroups"
FALLBACK = "job processes are found by tag and process group only (a process that leaves its session escapes a stop)"


def judge(mode: str, v2_mount: Path | None, init: str, unit: str, props: dict[str, str],
          unit_delegated: bool | None) -> Check:
    """mode: the config's `cgroups`; v2_mount: where the cgroup2 hierarchy's root is mounted (None: no
    cgroup v2); init: PID 1's name; props: `systemctl show` of the unit (Delegate, ControlGroup,
    LoadState); unit_delegated: whether the running unit's cgroup carries the delegate xattr (None
    when the unit is not running)."""
    if mode == "off":
        return Check(NAME, "warn", f"cgroups: off in the config: {FALLBACK}",
                     "set cgroups: auto (the default) in the config and restart the daemon")
    if v2_mount is None:
        return Check(NAME, "warn", f"no cgroup v2 hierarchy is mounted (a cgroup v1 host): {FALLBACK}",
                     "boot with systemd.unified_cgroup_hierarchy=1 (the default of systemd 247 and later)")
    if init != "systemd":
        if mode == "on":
            return Check(NAME, "ok", f"PID 1 is {init}; cgroups: on: the daemon manages the cgroup it is started in")
        return Check(NAME, "warn", f"PID 1 is {init}, not systemd: nothing delegates a cgroup to the daemon; {FALLBACK}",
                     "start the daemon in a cgroup of its own and set cgroups: on in the config")
    if props.get("LoadState") != "loaded":
        return Check(NAME, "unknown", f"{unit}.service is not installed: cannot tell whether its cgroup is delegated",
                     "sudo make install (the shipped unit has Delegate=yes)")
    if props.get("Delegate") != "yes":
        return Check(NAME, "fail", f"{unit}.service does not delegate its cgroup (Delegate={props.get('Delegate')}): "
                     f"{FALLBACK}", f"the shipped unit sets Delegate=yes: find what unsets it with `systemctl cat {unit}`")
    where = v2_mount / props.get("ControlGroup", "").lstrip("/")
    if unit_delegated is None:
        return Check(NAME, "ok", f"{unit}.service has Delegate=yes: its cgroup is the daemon's once it runs")
    if unit_delegated or mode == "on":
        how = "marked delegated (user.delegate)" if unit_delegated else "not marked, but cgroups: on"
        return Check(NAME, "ok", f"{where} is {how}: each attempt runs in a cgroup of its own")
    return Check(NAME, "warn", f"{where} has Delegate=yes but no user.delegate xattr (systemd before 252): {FALLBACK}",
                 "set cgroups: on in the config (the unit's cgroup is the daemon's) and restart the daemon")


def _v2_root(mountinfo: str) -> Path | None:
    """Where the root of the cgroup2 hierarchy is mounted (not a bind mount of a subtree)."""
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if right.split()[:1] == ["cgroup2"] and len(fields) > 4 and fields[3] == "/":
            return Path(fields[4])
    return None


def check_cgroups(ctx: DoctorContext) -> Check:
    try:
        mountinfo = (ctx.mountinfo or ctx.proc_root / "self" / "mountinfo").read_text()
        init = (ctx.proc_root / "1" / "comm").read_text().strip()
    except OSError as e:
        return Check(NAME, "unknown", f"cannot read /proc: {e}", "run spx doctor on the host")
    v2 = _v2_root(mountinfo)
    props: dict[str, str] = {}
    delegated = None
    if v2 is not None and init == "systemd" and ctx.cgroups_mode != "off":
        try:
            r = subprocess.run([ctx.systemctl, "show", f"{ctx.unit}.service", "-p",
                                "LoadState,Delegate,ControlGroup,ActiveState"],
                               capture_output=True, text=True, timeout=15, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            return Check(NAME, "unknown", f"systemctl failed: {e}", f"systemctl show {ctx.unit} -p Delegate")
        props = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
        if props.get("ActiveState") in ("active", "reloading", "deactivating") and props.get("ControlGroup"):
            delegated = cgroups.delegated(v2 / props["ControlGroup"].lstrip("/"))
    return judge(ctx.cgroups_mode, v2, init, ctx.unit, props, delegated)
