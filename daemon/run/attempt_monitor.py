"""The per-attempt monitor: the parent of the attempt's launcher, so its exit status outlives the daemon.

    python -I -S .../attempt_monitor.py DIR_FD NAME ATTEMPT_ID REQUEST_FD STATUS_FD [PLAN_FD GO_FD] -- SHIM_ARGV...
                                                                                   (launcher.start runs this)

Why: only a process's parent learns how it ended. If that is the daemon and the daemon is killed, a
launcher that exits meanwhile (done, or crashed) leaves no trace, and the next daemon must relaunch
an attempt that may have finished — a job run to its end twice. So, like conmon for containers, a
small stdlib process sits between: it forks the exec shim (SHIM_ARGV + its own request and status
pipes), passes it the launch request read whole from REQUEST_FD and passes its status on to STATUS_FD
(so it knows whether the attempt's argv was exec'd), waits for it, writes its exit status durably to
NAME in the root-owned directory DIR_FD (temp file, fsync, rename, fsync dir; 0600: only the
daemon reads it, and how a job ended is its owner's business — `spx status` says it to them),
and then ends the way its child ended (same exit code, or killed by the same signal), so the daemon,
its parent, reads the status from its own Popen exactly as before.

With PLAN_FD and GO_FD it starts a *standby* (launcher.Standby, standby_agent.py): the shim execs the
standby agent with a pipe from here as its stdin, the agent imports the launcher's modules and waits.
The attempt's final plan (argv, environment) arrives later, whole, on PLAN_FD and is passed on to the
agent as one line; the agent takes it once its imports are done, and closes its stdin. GO_FD then
tells the daemon whether the agent took it (EOF: yes; a JSON error: the agent was gone first). This
process is the one that waits for the agent (however large the plan, however long its imports take);
the daemon waits on GO_FD with a deadline, and discards a standby that does not take its plan in time.
Until a whole plan has reached the agent the attempt has not launched: a plan that never came (the
daemon discarded the standby, or died) ends the agent and is recorded as `launched: false`, exit 127,
so nobody takes the standby's end for the job's.

It is the attempt's session and process-group leader (spawn starts it with a new session), so the
stored pgid names it, and it carries the attempt's SPX_ATTEMPT_ID tag, so a stop that finds the
attempt by tag reaches it too. It survives SIGTERM/SIGINT/SIGHUP (a stop signals the whole attempt:
the job takes them, the monitor outlives it to write the record) but notes that one came: only root
can signal this root process, so it was a stop by the daemon, and a daemon that did not live to
record why must not count that end against the job. SIGKILL ends it like the rest. It runs as root
(the directory is root's), hence `-I -S` and stdlib only, like enter_attempt.py.

The record is one JSON object: {"attempt_id", "launched", "exit_code", "signal", "stop_signal", "end"}:
launched says the attempt's argv was exec'd (else the shim failed, and its exit is no job's); one of
exit_code/signal is null; stop_signal is the first stop signal the attempt got, or null; end is when
the attempt ended (Unix seconds), which a daemon that was down then records as its end.
"""

from __future__ import annotations

import array
import fcntl
import json
import os
import resource
import select
import signal
import sys
import termios
import time

RECORD_MODE = 0o600


def write_record(dir_fd: int, name: str, record: dict) -> None:
    tmp = f".{name}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, RECORD_MODE, dir_fd=dir_fd)
    try:
        os.fchmod(fd, RECORD_MODE)  # a stale temp file of the same name kept its mode through O_TRUNC
        os.write(fd, json.dumps(record).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)


def end_like(status: int) -> int:
    """Exit as the child did: by its signal (without a core dump of our own), else with its code."""
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    if sig is None:
        return os.waitstatus_to_exitcode(status)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        signal.signal(sig, signal.SIG_DFL)
    except (OSError, ValueError):  # SIGKILL/SIGSTOP: their disposition is the default already
        pass
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    os.kill(os.getpid(), sig)
    return 128 + sig  # not reached for a fatal signal


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_stop_signal: list[int] = []


def _note_stop(signum: int, _frame: object) -> None:
    if not _stop_signal:
        _stop_signal.append(signum)


def _read_all(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    return data


def _taken(to_agent: int) -> bool:
    """Wait until the agent has closed its end of the pipe; True if it read all of it first (it took
    its plan), False if it was gone with the plan still unread."""
    poller = select.poll()
    poller.register(to_agent, 0)  # POLLERR: no reader is left
    while not poller.poll():
        pass
    unread = array.array("i", [0])
    fcntl.ioctl(to_agent, termios.FIONREAD, unread)
    return unread[0] == 0


def _pass_plan(plan_fd: int, go_fd: int, to_agent: int) -> bool:
    """Pass the whole plan from PLAN_FD to the standby agent (on `to_agent`, its stdin, as one line);
    tell GO_FD how it went once the agent took it. True then: from then on the attempt is launched."""
    plan = _read_all(plan_fd)
    os.close(plan_fd)
    delivered = False
    try:
        if not isinstance(json.loads(plan or b"null"), dict):
            raise ValueError("no plan")
        view = memoryview(plan + b"\n")
        while view:
            view = view[os.write(to_agent, view):]
        if not _taken(to_agent):
            raise BrokenPipeError("the agent ended before it read its plan")
        delivered = True
    except ValueError:  # discarded, or the daemon died mid-write: the agent ends unlaunched
        pass
    except OSError as e:  # the agent is gone: its end (and the log) says why
        try:
            os.write(go_fd, json.dumps({"step": "standby", "errno": e.errno,
                                        "strerror": "the standby ended before the attempt's plan reached it",
                                        "filename": None}).encode())
        except OSError:
            pass
    os.close(to_agent)
    os.close(go_fd)
    return delivered


def main(argv: list[str]) -> int:
    dir_fd, name, attempt_id = int(argv[1]), argv[2], argv[3]
    request_fd, status_fd = int(argv[4]), int(argv[5])
    standby = argv.index("--") == 8
    plan_fd, go_fd = (int(argv[6]), int(argv[7])) if standby else (-1, -1)
    shim_argv = argv[argv.index("--") + 1:]
    for fd in (dir_fd, request_fd, status_fd, *((plan_fd, go_fd) if standby else ())):
        os.set_inheritable(fd, False)
    for sig in STOP_SIGNALS:  # handled, not ignored: a handler does not pass to the child through exec
        signal.signal(sig, _note_stop)
    # The request passes through here whole, or the attempt does not start: a daemon killed while
    # writing it leaves no half-started attempt whose exit could be taken for the job's.
    request = _read_all(request_fd)
    os.close(request_fd)
    try:
        json.loads(request)
    except ValueError:
        return 127
    to_shim_r, to_shim_w = os.pipe()
    from_shim_r, from_shim_w = os.pipe()
    os.set_inheritable(to_shim_r, True)
    os.set_inheritable(from_shim_w, True)
    agent_r, agent_w = os.pipe() if standby else (-1, -1)
    pid = os.fork()
    if pid == 0:
        try:
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            if standby:
                os.dup2(agent_r, 0)  # the agent's stdin: its plan comes this way
            os.execv(shim_argv[0], [*shim_argv, str(to_shim_r), str(from_shim_w)])
        finally:
            os._exit(127)
    os.close(to_shim_r)
    os.close(from_shim_w)
    if standby:
        os.close(agent_r)  # the agent's stdin is its own: EOF reaches it once we close ours
    try:
        os.write(to_shim_w, request)
    except BrokenPipeError:
        pass
    os.close(to_shim_w)
    # The shim's status, passed on: nothing (EOF at its exec) means the attempt's argv now runs.
    status_report = _read_all(from_shim_r)
    os.close(from_shim_r)
    launched = not status_report
    try:
        os.write(status_fd, status_report)
    except OSError:  # the daemon is gone: the record below still says how the launch went
        pass
    os.close(status_fd)
    if standby:
        if launched:
            launched = _pass_plan(plan_fd, go_fd, agent_w)
        else:
            for fd in (plan_fd, go_fd, agent_w):
                os.close(fd)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    killed_by = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    if standby and not launched and not status_report:  # a standby never given its plan: no end of the job's
        code, killed_by = 127, None
    record = {"attempt_id": attempt_id, "launched": launched, "exit_code": code, "signal": killed_by,
              "stop_signal": _stop_signal[0] if _stop_signal else None, "end": time.time()}
    try:
        write_record(dir_fd, name, record)
    except OSError as e:  # a full disk: the daemon, if it is alive, still gets the status from us
        print(f"spx: cannot record the attempt's exit ({e})", file=sys.stderr)
    return end_like(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
