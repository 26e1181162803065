"""Turn a job and an allocation into a process: argv, a clean environment, the user, the log.

`plan_launch` is pure (tested without processes); `spawn` does the I/O, with the attempt's output
going through a per-attempt log relay (log_relay.py) that caps and rotates the log. No shell anywhere: argv is a
list. Workers run as the job file's owner, in a new session (so the whole attempt is one process
group) and, where the daemon manages cgroups, in the attempt's own cgroup from their first
instruction on; their environment is built from scratch — the daemon's own variables never leak in.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import pwd
import select
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from spx.daemon.contract import worker_env
from spx.daemon.core import bounded
from spx.daemon.core.spec import JobSpec
from spx.daemon.core.users import LogAccess, log_access
from spx.daemon.run import rendezvous

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The exec shim runs as root by file path, with site packages off, so it can only ever run stdlib.
SHIM = Path(__file__).with_name("enter_attempt.py")
SHIM_ENV = {"PATH": SAFE_PATH, "LANG": "C.UTF-8"}
# The log relay and the attempt monitor: root too (the log dir is root's), so started the same way.
RELAY = Path(__file__).with_name("log_relay.py")
MONITOR = Path(__file__).with_name("attempt_monitor.py")
EXIT_RECORD_MAX_BYTES = 4096


@dataclass(frozen=True)
class LaunchContext:
    """What the daemon decided for this attempt."""

    attempt: int
    attempt_id: str
    gpus: list[int]
    port: int
    checkpoint_dir: Path
    resume_from: Path | None
    heartbeat_file: Path
    rank_log_dir: Path
    home: str
    user: str
    local_checkpoint_dir: Path | None = None
    generation: int | None = None  # a job across hosts: the round this attempt joins (run/gang.py)
    fence: int | None = None  # the job's lease generation taken for this attempt: SPX_FENCE (contract/fencing.py)
    skip_steps: worker_env.StepRanges = ()  # a divergence rollback's skipped data: SPX_SKIP_STEPS
    extra_args: list[str] = field(default_factory=list)  # restart.on_failure.divergence.args, once diverged


@dataclass(frozen=True)
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]
    cwd: str


def free_port() -> int:
    """A TCP port nobody listens on right now, for this attempt's rendezvous. A fresh one per
    attempt, so a relaunch never collides with a dying store of the previous attempt."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _expand(args: list[str], ctx: LaunchContext) -> list[str]:
    values = {"resume_from": str(ctx.resume_from or ""), "checkpoint_dir": str(ctx.checkpoint_dir)}
    return [a.replace("{resume_from}", values["resume_from"]).replace("{checkpoint_dir}", values["checkpoint_dir"]) for a in args]


def deepspeed_config_in(args: list[str]) -> str | None:
    """The DeepSpeed config file a script's arguments name: `--deepspeed_config FILE` (DeepSpeed's
    own argument), or `--deepspeed FILE` as Hugging Face scripts take it (a value, not a switch)."""
    for i, arg in enumerate(args):
        for flag in ("--deepspeed_config", "--deepspeed"):
            if arg.startswith(flag + "="):
                return arg[len(flag) + 1:] or None
            if arg == flag and i + 1 < len(args) and not args[i + 1].startswith("-"):
                return args[i + 1]
    return None


def deepspeed_config_args(spec: JobSpec) -> list[str]:
    """`--deepspeed --deepspeed_config FILE` for the script, unless its own arguments already name
    the config (`spx submit -- deepspeed … --deepspeed ds.json` keeps them as they are): a second
    `--deepspeed` would break a Hugging Face script's parser, which takes the file as its value."""
    if deepspeed_config_in(spec.args):
        return []
    return ["--deepspeed", "--deepspeed_config", spec.deepspeed_config or ""]


def plan_launch(spec: JobSpec, ctx: LaunchContext, default_python: str = sys.executable) -> LaunchPlan:
    python = str(spec.python or default_python)
    target = ["-m", spec.module] if spec.module else [spec.script or ""]
    args = _expand(spec.args, ctx)
    if ctx.resume_from is not None:
        args += _expand(spec.resume_args, ctx)
    args += _expand(ctx.extra_args, ctx)
    nproc = spec.worker_count
    if spec.launcher == "torchrun":
        argv = [
            python, "-m", "torch.distributed.run",
            *rendezvous.torchrun_args(spec.nodes, spec.name, nproc, ctx.port, ctx.generation),
            # Every restart is a fresh launch by the daemon: torchrun's in-agent
            # restart proved unreliable, and the daemon must see each failure to back off.
            "--max-restarts=0",
            # Rank-prefixed console lines in the attempt log, and per-rank files beside it.
            "--tee=3", f"--log-dir={ctx.rank_log_dir}",
            *(["--module", spec.module] if spec.module else [spec.script or ""]),
            *args,
        ]
    elif spec.launcher == "deepspeed":
        # DeepSpeed's single-node launcher with the allocation as its world info — what
        # `deepspeed --include localhost:4,5` runs. Not `deepspeed --num_gpus=N`: that resets
        # CUDA_VISIBLE_DEVICES to 0..N-1, i.e. onto GPUs allocated to another job.
        slots = ctx.gpus or list(range(nproc))
        world = base64.urlsafe_b64encode(json.dumps({"localhost": slots}).encode()).decode()
        argv = [
            python, "-m", "deepspeed.launcher.launch",
            f"--world_info={world}", "--master_addr=127.0.0.1", f"--master_port={ctx.port}",
            spec.script or "", *deepspeed_config_args(spec), *args,
        ]
    else:
        argv = [python, *target, *args]
    env = {
        "PATH": f"{Path(python).parent}:{SAFE_PATH}",
        "HOME": ctx.home,
        "USER": ctx.user,
        "LOGNAME": ctx.user,
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        # One BLAS thread per worker unless the job says otherwise (torchrun would warn and pick 1).
        "OMP_NUM_THREADS": "1",
        **spec.env,
        worker_env.ENV_JOB: spec.name,
        worker_env.ENV_ATTEMPT: str(ctx.attempt),
        worker_env.ENV_ATTEMPT_ID: ctx.attempt_id,
        worker_env.ENV_CHECKPOINT_DIR: str(ctx.checkpoint_dir),
        worker_env.ENV_RESUME_FROM: str(ctx.resume_from or ""),
        worker_env.ENV_HEARTBEAT_FILE: str(ctx.heartbeat_file),
        **({worker_env.ENV_LOCAL_CHECKPOINT_DIR: str(ctx.local_checkpoint_dir)} if ctx.local_checkpoint_dir else {}),
        **({worker_env.ENV_FENCE: str(ctx.fence)} if ctx.fence is not None else {}),
        **({worker_env.ENV_CHECKPOINT_KEEP: str(spec.checkpoints.keep)} if spec.checkpoints.keep is not None else {}),
        **({worker_env.ENV_SKIP_STEPS: worker_env.format_skip_steps(ctx.skip_steps)} if ctx.skip_steps else {}),
        **({worker_env.ENV_REPLAY: str(spec.replay.from_step if spec.replay.from_step is not None else "")}
           if spec.replay is not None else {}),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(ctx.port),
    }
    if ctx.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in ctx.gpus)
        # The indices are NVML's, which count in PCI bus order; CUDA's default order is fastest
        # first, which on a host of mixed GPUs would put the job on GPUs it was not given.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    else:
        # A CPU job must not grab a GPU by accident.
        env["CUDA_VISIBLE_DEVICES"] = ""
    cwd = str(spec.workdir or ctx.home)
    return LaunchPlan(argv=argv, env=env, cwd=cwd)


@dataclass(frozen=True)
class Spawned:
    """A started attempt: `proc` is its monitor, leader of the attempt's process group and session,
    which ends as the launcher ends (same code or signal); `relay` carries the attempt's stdout+stderr
    into the capped log and exits at EOF."""

    proc: subprocess.Popen
    relay: subprocess.Popen

    @property
    def relay_pid(self) -> int:
        return self.relay.pid


def start_relay(log_dir_fd: int, log_name: str, max_log_bytes: int, readers: LogAccess,
                source_fd: int) -> subprocess.Popen:
    """The log relay (log_relay.py) reading `source_fd`, writing `log_name` in the directory
    `log_dir_fd`, for `readers` to read. Its own session: a group kill of the attempt must not cut off
    the attempt's last words."""
    return subprocess.Popen(
        [sys.executable, "-I", "-S", str(RELAY), str(log_dir_fd), log_name, str(max_log_bytes), str(readers.uid),
         str(readers.gid), f"{readers.file_mode:o}"],
        cwd="/", env=SHIM_ENV, stdin=source_fd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        close_fds=True, pass_fds=(log_dir_fd,), start_new_session=True,
    )


def exit_record_name(log_name: str) -> str:
    """Where the attempt monitor records how the attempt `log_name` logs to ended: attempt-N.exit."""
    return f"{log_name.removesuffix('.log')}.exit"


@dataclass(frozen=True)
class ExitRecord:
    """How an attempt's launcher ended, as its monitor saw it. `launched`: the attempt's argv was
    exec'd (else the launch failed, and the exit is not the job's). `stopped`: a stop signal (SIGTERM,
    SIGINT, SIGHUP from root: the daemon) reached the attempt before it ended."""

    launched: bool
    exit_code: int | None
    signal: int | None
    stopped: bool
    ended: float | None = None  # Unix seconds


def recorded_exit(log_dir: Path, log_name: str, attempt_id: str) -> ExitRecord | None:
    """What the attempt monitor recorded for this attempt, or None if it has not (the attempt still
    runs, or its monitor was killed with it). For a daemon that finds an open attempt from before it
    started: the launcher may have ended while no daemon watched. The log dir is root's, so the
    record is the monitor's; it is still read without following links and capped."""
    try:
        fd = os.open(log_dir / exit_record_name(log_name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        f = bounded.Fields(bounded.parse_json(os.read(fd, EXIT_RECORD_MAX_BYTES + 1), "exit record",
                                              max_bytes=EXIT_RECORD_MAX_BYTES), "exit record")
        if f.text("attempt_id", 256, missing=None) != attempt_id:
            return None
        # An exit status is 0-255, a signal number below 128 (SIGRTMAX is 64): what the store keeps.
        code, sig = f.whole("exit_code", 0, 255, missing=None), f.whole("signal", 0, 127, missing=None)
        ended = f.real("end", 0.0, bounded.MAX_TIME, missing=None)
    except (OSError, bounded.Garbage):
        return None
    finally:
        os.close(fd)
    if code is None and sig is None:
        return None
    return ExitRecord(f.doc.get("launched") is True, code, sig, stopped=f.doc.get("stop_signal") is not None,
                      ended=ended)


def spawn(plan: LaunchPlan, uid: int, log_dir_fd: int, log_name: str, cgroup: Path | None,
          max_log_bytes: int, readers: LogAccess | None = None) -> Spawned:
    """Start the attempt as `uid` in a new session (and in `cgroup`, if given) through the attempt
    monitor (attempt_monitor.py, the session leader: it records the exit status in the log dir, see
    `recorded_exit`) and the exec shim (enter_attempt.py); stdout+stderr go through a log relay into
    `log_name` inside the directory `log_dir_fd` (root's), capped at `max_log_bytes` per file with one
    rotated file, readable by `readers` (default: the owner alone). Returns once the attempt's argv has
    been exec'd; raises OSError, as subprocess would, when any step before that failed (the relay then
    has the shim's last words in the log and has exited). The plan's SPX_ATTEMPT_ID ties the exit
    record to this attempt."""
    started = start_monitor(plan, uid, log_dir_fd, log_name, cgroup, max_log_bytes, readers=readers)
    raise_launch_failure(started, started.status_r)
    return Spawned(proc=started.proc, relay=started.relay)


@dataclass
class Started:
    """An attempt monitor just started: `status_r` tells whether the shim exec'd (EOF) or why not;
    for a standby, `plan_w` takes its plan and `go_r` tells whether the plan reached the agent."""

    proc: subprocess.Popen
    relay: subprocess.Popen
    status_r: int
    plan_w: int = -1
    go_r: int = -1


def start_monitor(plan: LaunchPlan, uid: int, log_dir_fd: int, log_name: str, cgroup: Path | None,
                  max_log_bytes: int, standby: bool = False, readers: LogAccess | None = None,
                  nice: int | None = None) -> Started:
    """The attempt monitor and its log relay, started; the shim's status is the caller's to read
    (`raise_launch_failure`). With `standby`, the monitor keeps the attempt's stdin pipe and waits
    for a plan (attempt_monitor.py's doc; standby.py). The log is for `readers` (core.users.log_access;
    default: the owner alone). `nice`: the attempt's processes start at that nice value (None: the
    daemon's)."""
    attempt_id = plan.env.get(worker_env.ENV_ATTEMPT_ID, "")
    user = pwd.getpwuid(uid)
    as_other = uid != os.getuid()
    request = {
        "argv": plan.argv, "env": plan.env, "cwd": plan.cwd, "umask": 0o022,
        "cgroup": str(cgroup) if cgroup is not None else None, "nice": nice,
        "uid": uid if as_other else None,
        "gid": user.pw_gid,
        "groups": os.getgrouplist(user.pw_name, user.pw_gid),
    }
    out_r, out_w = os.pipe()
    try:
        relay = start_relay(log_dir_fd, log_name, max_log_bytes, readers or log_access(uid, None), out_r)
    except BaseException:
        os.close(out_w)
        raise
    finally:
        os.close(out_r)
    request_r, request_w = os.pipe()
    status_r, status_w = os.pipe()
    plan_r, plan_w = os.pipe() if standby else (-1, -1)
    go_r, go_w = os.pipe() if standby else (-1, -1)
    theirs = (request_r, status_w, *((plan_r, go_w) if standby else ()))
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(MONITOR), str(log_dir_fd), exit_record_name(log_name), attempt_id,
             str(request_r), str(status_w), *((str(plan_r), str(go_w)) if standby else ()),
             "--", sys.executable, "-I", "-S", str(SHIM)],
            cwd="/", env={**SHIM_ENV, worker_env.ENV_ATTEMPT_ID: attempt_id}, stdin=subprocess.DEVNULL,
            stdout=out_w, stderr=out_w, close_fds=True, pass_fds=(*theirs, log_dir_fd),
            start_new_session=True,
        )
    except BaseException:
        for fd in (request_w, status_r, out_w, *((plan_w, go_r) if standby else ())):
            os.close(fd)  # the relay sees EOF and exits
        relay.wait()
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    os.close(out_w)
    with os.fdopen(request_w, "wb") as w:
        try:
            w.write(json.dumps(request).encode())
        except BrokenPipeError:  # the shim died before reading; its status (or exit) says why
            pass
    return Started(proc, relay, status_r, plan_w, go_r)


def plan_json(plan: LaunchPlan) -> bytes:
    """A plan as a standby's agent reads it (standby_agent.py): the argv and the environment."""
    return json.dumps({"argv": plan.argv, "env": plan.env}).encode()


def _wait_for(fd: int, events: int, deadline: float, what: str) -> None:
    """Until `fd` is ready for `events`; TimeoutError (ETIMEDOUT) past the monotonic `deadline`."""
    poller = select.poll()
    poller.register(fd, events)
    while not poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
        if time.monotonic() >= deadline:
            raise TimeoutError(errno.ETIMEDOUT, f"no {what} in time (the process on the other end waits)")


def read_to_eof(fd: int, deadline: float | None, what: str = "launch status") -> bytes:
    """Everything `fd` gives until EOF. With a `deadline` (monotonic) the fd is read non-blocking and
    TimeoutError is raised past it: the other end is a process that may wait on a user (a shim in a
    hung working directory, an agent still importing)."""
    data = b""
    if deadline is None:
        while chunk := os.read(fd, 65536):
            data += chunk
        return data
    os.set_blocking(fd, False)
    while True:
        _wait_for(fd, select.POLLIN, deadline, what)
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            continue
        if not chunk:
            return data
        data += chunk


def write_all(fd: int, data: bytes, deadline: float | None, what: str = "plan") -> None:
    """Write all of `data` to `fd`; with a `deadline`, non-blocking, TimeoutError past it (a pipe
    whose reader does not read: the plan may be larger than a pipe holds)."""
    if deadline is not None:
        os.set_blocking(fd, False)
    view = memoryview(data)
    while view:
        if deadline is not None:
            _wait_for(fd, select.POLLOUT, deadline, what)
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            continue


def raise_launch_failure(started: Started, status_fd: int, deadline: float | None = None) -> None:
    """Read `status_fd` (closed here) to its end (by the monotonic `deadline`, if given: TimeoutError
    past it): nothing means the step it reports happened; a JSON failure is raised as the OSError a
    failed exec gives, once the monitor and the relay have ended (the relay has the shim's last
    words in the log)."""
    try:
        status = read_to_eof(status_fd, deadline)
    finally:
        os.close(status_fd)
    if not status:
        return
    started.proc.wait()
    try:  # the shim was the pipe's only writer: EOF once its message is in the log
        started.relay.wait(timeout=10)
    except subprocess.TimeoutExpired:  # a stuck disk: the daemon's reaper collects it later
        pass
    failure = json.loads(status)
    what = failure["strerror"] if failure["step"] == "exec" else f"{failure['step']}: {failure['strerror']}"
    if failure["errno"] is None:
        raise OSError(what)
    raise OSError(failure["errno"], what, failure["filename"])
