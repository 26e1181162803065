"""A real systemd, booted as PID 1 of private namespaces, for testing the unit (tests/systemd/).

Recipe and warning: /work/shared/systemd-sandbox.md. `sandbox-init.sh` builds the container's root
(nothing of the host's /tmp, /var, /run or /etc is writable from inside it) and execs systemd;
this module starts it in its own cgroup, drives it with `nsenter`, and tears it down with SIGKILL
to that systemd, which ends every process in the namespace. The host keeps no trace but an empty
mount-point directory, which `close()` removes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

INIT_SCRIPT = Path(__file__).with_name("sandbox-init.sh")
UNSHARE = ["unshare", "--fork", "--pid", "--mount", "--uts", "--ipc", "--net", "--cgroup", "--propagation", "private"]


def cannot_run_reason() -> str | None:
    """Why a sandbox cannot boot on this machine, or None. Only real impossibilities count."""
    if os.geteuid() != 0:
        return "needs root (unshare of mount/pid namespaces and booting systemd)"
    for tool in ("unshare", "nsenter", "findmnt", "pivot_root"):
        if shutil.which(tool) is None:
            return f"{tool} (util-linux) is not installed"
    if not os.access("/lib/systemd/systemd", os.X_OK):
        return "systemd is not installed (/lib/systemd/systemd)"
    if host_cgroup2() is None:
        return "no cgroup2 hierarchy mounted on this host (systemd in the sandbox needs one)"
    probe = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"unshare is not permitted here: {probe.stderr.strip()}"
    return None


def host_cgroup2() -> Path | None:
    """Where this process's cgroup sits in the host's unified (v2) hierarchy, if one is mounted."""
    mount = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[0] == "cgroup2":
            mount = left.split()[4]
            break
    own = next((ln[3:] for ln in Path("/proc/self/cgroup").read_text().splitlines() if ln.startswith("0::")), None)
    if mount is None or own is None:
        return None
    return Path(mount) / own.lstrip("/")


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                kids = Path(f"/proc/{p}/task/{t}/children").read_text().split()
            except OSError:
                continue
            for k in map(int, kids):
                if k not in found:
                    found.add(k)
                    todo.append(k)
    return found


class Sandbox:
    """One booted systemd. `keep`: host directories bound read-only at their own paths inside."""

    live: list[Sandbox] = []  # booted and not yet closed, for the leak guard

    def __init__(self, base: Path, keep: list[Path]):
        self.base = base
        self.root = base / "root"
        self.keep = _outermost(keep)
        self.cgroup: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.pid = 0  # systemd's pid, as the host sees it
        self.boot_log = base / "sandbox-init.log"
        self.install_log = ""  # what install.sh printed, for the install test

    # --- life -----------------------------------------------------------------------------------

    def boot(self, timeout: float = 60) -> Sandbox:
        parent = host_cgroup2()
        assert parent is not None
        self.cgroup = parent / f"spx-sandbox-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.cgroup.mkdir()
        self.root.mkdir(parents=True, exist_ok=True)
        host_ns = os.readlink("/proc/self/ns/mnt")
        # bash moves itself into the sandbox's own cgroup first: unshare --cgroup then makes that
        # cgroup the root systemd sees, and everything it creates stays below it.
        argv = ["bash", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.cgroup),
                *UNSHARE, "--", "bash", str(INIT_SCRIPT), str(self.root), host_ns, *map(str, self.keep)]
        Sandbox.live.append(self)
        with self.boot_log.open("w") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self.pid:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"sandbox did not boot: {self.boot_log.read_text()[-3000:]}")
            self.pid = self._namespace_init() or 0
            time.sleep(0 if self.pid else 0.05)
        state = ""
        while not state and time.monotonic() < deadline:  # empty until systemd's bus socket exists
            state = self.run("systemctl", "is-system-running", "--wait", check=False, timeout=timeout).stdout.strip()
            time.sleep(0 if state else 0.05)
        if state not in ("running", "degraded"):
            failed = self.run("systemctl", "--failed", "--no-pager", check=False).stdout
            raise AssertionError(f"sandbox systemd is {state!r}: {failed}")
        return self

    def _namespace_init(self) -> int | None:
        """The host pid of the namespace's PID 1 once it has become systemd. Not just any process
        named systemd: its forked children carry that name too, until they exec."""
        assert self.proc is not None
        for kid in _descendants(self.proc.pid):
            try:
                status = Path(f"/proc/{kid}/status").read_text()
            except OSError:
                continue
            nspid = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), [])
            if nspid[-1:] == ["1"] and Path(f"/proc/{kid}/comm").read_text().strip() == "systemd":
                return kid
        return None

    def close(self) -> None:
        if self in Sandbox.live:
            Sandbox.live.remove(self)
        if self.cgroup is not None and (self.cgroup / "cgroup.kill").exists():
            (self.cgroup / "cgroup.kill").write_text("1")  # every process in the sandbox's cgroups
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)  # PID 1 of the namespace: the kernel kills all of it
            except ProcessLookupError:
                pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.cgroup is not None:
            _remove_cgroup_tree(self.cgroup)
        try:
            self.root.rmdir()  # only ever a mount point; its tmpfs went with the namespace
        except OSError:
            pass

    def pids(self) -> set[int]:
        """Every process of the sandbox, as host pids (for the leak guard)."""
        if self.proc is None or self.proc.poll() is not None:
            return set()
        return {self.proc.pid, *_descendants(self.proc.pid)}

    @classmethod
    def all_pids(cls) -> set[int]:
        return {pid for sb in cls.live for pid in sb.pids()}

    # --- driving it -----------------------------------------------------------------------------

    def run(self, *argv: str, check: bool = True, timeout: float = 60, user: str | None = None,
            input: str | None = None) -> subprocess.CompletedProcess:
        """Run a command inside the sandbox (all its namespaces, its root), as root or `user`."""
        as_user = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"] if user else []
        cmd = ["nsenter", "-t", str(self.pid), "-a", "-r", "-w", "--", *as_user, *argv]
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
               "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": "", "HOME": f"/home/{user}" if user else "/root"}
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, input=input)
        if check and res.returncode != 0:
            raise AssertionError(f"in sandbox: {' '.join(argv)} exited {res.returncode}:\n{res.stdout}{res.stderr}")
        return res

    def systemctl(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        return self.run("systemctl", "--no-pager", *args, check=check, timeout=timeout)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.systemctl("show", unit, "-p", ",".join(props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, unit: str, lines: int = 400) -> str:
        return self.run("journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "short-precise",
                        check=False).stdout

    def journal_json(self, unit: str) -> list[dict]:
        """The unit's journal as entries; the daemon's own lines parsed under "spx": from SPX_JSON, the
        line whole that it sends to the journal natively (core/journal.py), or from a MESSAGE that is
        JSON (a line that reached the journal through stdout)."""
        out = self.run("journalctl", "-u", unit, "--no-pager", "-o", "json", "--output-fields",
                       "MESSAGE,SPX_JSON,_PID,_COMM", check=False).stdout
        entries = []
        for line in out.splitlines():
            entry = json.loads(line)
            msg = entry.get("SPX_JSON") or entry.get("MESSAGE")
            if isinstance(msg, str) and msg.startswith("{"):
                try:
                    entry["spx"] = json.loads(msg)
                except ValueError:
                    pass
            entries.append(entry)
        return entries

    def path(self, inside: str) -> Path:
        """A path inside the sandbox, as the host can read (and write) it."""
        return Path(f"/proc/{self.pid}/root") / inside.lstrip("/")

    def write(self, inside: str, text: str, mode: int = 0o644) -> None:
        p = self.path(inside)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        p.chmod(mode)


def _outermost(dirs: list[Path]) -> list[Path]:
    """Drop directories inside another one of the list (binding the outer one covers them)."""
    resolved = sorted({Path(os.path.realpath(d)) for d in dirs}, key=lambda p: len(p.parts))
    out: list[Path] = []
    for d in resolved:
        if not any(d == o or o in d.parents for o in out):
            out.append(d)
    return out


def _remove_cgroup_tree(top: Path, timeout: float = 10) -> None:
    """rmdir the sandbox's cgroups, deepest first (the kernel frees them once their tasks are gone)."""
    deadline = time.monotonic() + timeout
    while top.exists():
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(Path(w[0]).parts)):
            try:
                os.rmdir(dirpath)
            except OSError:
                pass
        if time.monotonic() > deadline:
            print(f"sandbox: could not remove cgroup {top}", file=sys.stderr)
            return
        time.sleep(0.1)


def python_dirs() -> list[Path]:
    """The directories this interpreter needs: the venv and the python it was made from."""
    dirs = [Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parent.parent]
    return [d for d in dirs if not str(d).startswith("/usr")]
