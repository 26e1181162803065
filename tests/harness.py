"""Drive a real daemon in tests: `spx-trainer --root DIR` as a subprocess, and the real `spx` CLI.

The daemon is started exactly as a user would start it (console scripts from the venv); its JSON
log lines are collected from stdout so tests can wait on events instead of sleeping.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
# The examples print the trained model's hash at the end (bitwise comparisons of two runs).
FINAL_HASH = re.compile(r"final_state_sha256=([0-9a-f]{64})")


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def attempt_tag(pid: int) -> str | None:
    """The SPX_ATTEMPT_ID a process was started with (every process of an attempt has it)."""
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if item.startswith(b"SPX_ATTEMPT_ID="):
            return item.split(b"=", 1)[1].decode()
    return None


def job_pids(name: str, attempt_id: str | None = None) -> list[int]:
    """Every live (non-zombie) process whose environment says it belongs to job `name` (the
    daemon sets SPX_JOB for all of a job's processes), found from /proc as an operator would; with
    `attempt_id`, only that attempt's (the job's next attempt may have a standby launcher already)."""
    tag = f"SPX_JOB={name}".encode()
    attempt = f"SPX_ATTEMPT_ID={attempt_id}".encode() if attempt_id else None
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            env = Path(entry.path, "environ").read_bytes().split(b"\0")
            state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if tag in env and (attempt is None or attempt in env) and state not in ("Z", "X"):
            found.append(int(entry.name))
    return sorted(found)


def running_attempt_pids(name: str) -> list[int]:
    """The processes of job `name`'s running attempt: those tagged as its workers are (LOCAL_RANK
    set). A torchrun/DeepSpeed job's next attempt may already have its launcher waiting as a
    standby (daemon/run/standby.py), tagged for that attempt: it is not one of these."""
    for pid in job_pids(name):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(item.startswith(b"LOCAL_RANK=") for item in env):
            tag = attempt_tag(pid)
            return job_pids(name, tag) if tag else []
    return []


class LoopWatch:
    """The daemon's watchdog pings, read from a notify socket the test owns.

    The daemon pings (sd_notify WATCHDOG=1) only after a full turn of its main loop, every
    WATCHDOG_USEC / 2 = 0.5 s here by default (a quiet loop then turns as often: never less often than
    it pings), so the longest gap between two pings — or since the last one, while the daemon is
    still up — is the longest its loop went without turning: what a hostile probe holds below 2 s
    ("the loop kept turning"). `watchdog_seconds`: another WatchdogSec, e.g. the unit's 60 s for a
    benchmark of the daemon at rest. A filesystem socket, not an abstract one, so a daemon in
    another network namespace reaches it too.
    """

    def __init__(self, watchdog_seconds: float = 1.0) -> None:
        self.watchdog_usec = str(int(watchdog_seconds * 1_000_000))
        self.path = Path(tempfile.gettempdir()) / f"spx-notify-{uuid.uuid4().hex[:12]}.sock"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(self.path))
        self._sock.settimeout(0.2)
        self.pings: list[float] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._read, name="loop-watch", daemon=True)
        self._thread.start()

    def env(self) -> dict[str, str]:
        return {"NOTIFY_SOCKET": str(self.path), "WATCHDOG_USEC": self.watchdog_usec}

    def _read(self) -> None:
        while not self._closed.is_set():
            try:
                data = self._sock.recv(4096)
            except (TimeoutError, OSError):
                continue
            if b"WATCHDOG=1" in data.split(b"\n"):
                self.pings.append(time.monotonic())

    def max_gap(self, running: bool = True) -> float:
        """The longest the loop went without a ping since its first one (0 before two pings), counting
        the time since the last ping while `running`."""
        pings = list(self.pings)
        gaps = [b - a for a, b in zip(pings, pings[1:], strict=False)]
        if running and pings:
            gaps.append(time.monotonic() - pings[-1])
        return max(gaps, default=0.0)

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join(timeout=2)
        self._sock.close()
        self.path.unlink(missing_ok=True)


class Daemon:
    """A running `spx-trainer` rooted in `root`."""

    def __init__(self, root: Path, gpu_backend: str = "none", extra_args: list[str] | None = None,
                 config: dict | None = None, env: dict[str, str] | None = None, cgroup: Path | None = None,
                 prefix: list[str] | None = None, log_level: str = "info", watchdog_seconds: float = 1.0):
        self.root = root
        self.log_level = log_level  # "debug": its main loop's turns are logged too (wait_turns)
        self.prefix = prefix or []  # runs the daemon under it, e.g. ["ip", "netns", "exec", NS] (it execs)
        self.cgroup = cgroup  # start the daemon in this cgroup v2 directory (as systemd starts it in the unit's)
        self.gpu_backend = gpu_backend
        self.extra_args = extra_args or []
        self.config = config
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.lines: list[dict] = []
        self._reader: threading.Thread | None = None
        self.metrics_port: int | None = None
        self.loop: LoopWatch | None = None  # its watchdog pings, unless the test brings its own NOTIFY_SOCKET
        self.watchdog_seconds = watchdog_seconds  # the WatchdogSec it is told (LoopWatch)

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    def checkpoint_dir(self, name: str, owner: str | None = None) -> Path:
        """A job's default checkpoint dir: checkpoints_root/OWNER/NAME (OWNER: this test's user)."""
        return self.root / "checkpoints" / (owner or pwd.getpwuid(os.getuid()).pw_name) / name

    def start(self, timeout: float = 60) -> Daemon:
        args = [str(BIN / "spx-trainer"), "--root", str(self.root), "--gpu-backend", self.gpu_backend,
                "--metrics-address", "127.0.0.1:0", "--log-level", self.log_level, *self.extra_args]
        if self.config is not None:
            import yaml

            cfg = self.root.parent / f"{self.root.name}-config.yaml"
            cfg.write_text(yaml.safe_dump(self.config))
            args += ["--config", str(cfg)]
        if self.cgroup is not None:
            args = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.cgroup), *args]
        args = [*self.prefix, *args]
        self.lines = []
        env = {**os.environ, **self.env}
        if "NOTIFY_SOCKET" not in self.env:
            if self.loop is not None:
                self.loop.close()
            self.loop = LoopWatch(self.watchdog_seconds)
            env.update(self.loop.env())
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
        self._reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        self._reader.start()
        ready = self.wait_event("daemon_ready", timeout=timeout)
        self.metrics_port = int(ready["metrics"].rsplit(":", 1)[1])
        return self

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        loop = self.loop
        for line in proc.stdout:
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                self.lines.append({"event": "raw", "text": line.rstrip()})
        if loop is not None:  # the daemon is gone (stopped, or killed by the test): no more pings
            loop.close()

    def events(self, name: str, **match: object) -> list[dict]:
        return [e for e in list(self.lines) if e.get("event") == name and all(e.get(k) == v for k, v in match.items())]

    def wait_event(self, name: str, timeout: float = 30, **match: object) -> dict:
        def found():
            if self.proc is not None and self.proc.poll() is not None and not self.events(name, **match):
                raise AssertionError(f"daemon exited ({self.proc.returncode}) before {name}: {self.lines[-20:]}")
            hits = self.events(name, **match)
            return hits[-1] if hits else None

        return wait_for(found, timeout, f"daemon event {name} {match}")

    def wait_more(self, name: str, count: int = 1, timeout: float = 30, **match: object) -> dict:
        """Until the daemon has logged `count` more `name` events (matching `match`) than it had now;
        the last of them."""
        before = len(self.events(name, **match))

        def logged():
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"daemon exited ({self.proc.returncode}) waiting for {name}: {self.lines[-20:]}")
            hits = self.events(name, **match)
            return hits[-1] if len(hits) >= before + count else None

        return wait_for(logged, timeout, f"{count} more daemon events {name} {match}")

    def wait_turns(self, turns: int = 2, timeout: float = 30) -> None:
        """Until the main loop has finished `turns` more turns: whatever a turn would do (intake,
        commands, supervise, schedule), it has had the chance to do; with 2, a whole turn began after
        this call. Before saying that something did not happen, instead of sleeping."""
        assert self.log_level == "debug", "the loop's turns are logged at debug: Daemon(..., log_level='debug')"
        self.wait_more("loop_turn", turns, timeout)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        if self._reader:
            self._reader.join(timeout=5)

    def stop(self, timeout: float = 180) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._reader:
            self._reader.join(timeout=5)
        if self.loop is not None:
            self.loop.close()
        return self.proc.returncode

    def spx(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        res = subprocess.run([str(BIN / "spx"), "--root", str(self.root), *args], capture_output=True, text=True,
                             timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"spx {' '.join(args)} exited {res.returncode}: {res.stderr}{res.stdout}")
        return res

    def ls(self) -> list[dict]:
        return json.loads(self.spx("ls", "--json").stdout)

    def status(self, name: str) -> dict:
        return json.loads(self.spx("status", name, "--json", check=False).stdout)

    def job(self, name: str) -> dict | None:
        return next((j for j in self.ls() if j["name"] == name), None)

    def wait_state(self, name: str, states: set[str] | str, timeout: float) -> dict:
        wanted = {states} if isinstance(states, str) else states

        def reached():
            j = self.job(name)
            return j if j and j["state"] in wanted else None

        return wait_for(reached, timeout, f"job {name} to reach {wanted} (now: {self.job(name)})", interval=0.3)

    def final_hash(self, name: str, attempt: int) -> str:
        """The model hash the examples print at the end of job `name`'s attempt `attempt` (exactly one)."""
        found = FINAL_HASH.findall((self.root / "log" / name / f"attempt-{attempt}.log").read_text(errors="replace"))
        assert len(found) == 1, f"expected one final hash in {name} attempt {attempt}: {found}"
        return found[0]

    def drop(self, name: str, text: str) -> Path:
        """Write a job file into the spool the way an editor or `cp` would (write, then close)."""
        path = self.spool / name
        path.write_text(text)
        return path


@contextmanager
def small_tmpfs(mnt: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `mnt` (made here) for the test's duration: a disk that fills up.
    The test is skipped, with the reason, where mounting is not permitted."""
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@contextmanager
def sqlite3_holding(path: Path) -> Iterator[subprocess.Popen]:
    """The sqlite3 shell with an exclusive transaction open on the store at `path` (an operator
    poking at it), for the `with` block; killed after it."""
    shell = subprocess.Popen(["sqlite3", str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert shell.stdin is not None and shell.stdout is not None
        shell.stdin.write("BEGIN EXCLUSIVE;\nSELECT 'held';\n")
        shell.stdin.flush()
        assert shell.stdout.readline().strip() == "held"
        yield shell
    finally:
        shell.kill()
        shell.wait()


def as_user(user: pwd.struct_passwd, fn: Callable, *args: object):
    """Run fn(*args) in a forked child that has become `user`; return its JSON-able result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            out = json.dumps(fn(*args)).encode()
        except BaseException as e:  # noqa: BLE001 — reported to the parent
            out = json.dumps({"exception": repr(e)}).encode()
        os.write(w, out)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)
