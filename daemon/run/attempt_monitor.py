"""The per-attempt monitor: the parent of the attempt's launcher, so its exit status outlives the daemon.

    python -I -S .../spx/daemon/run/attempt_monitor.py DIR_FD NAME ATTEMPT_ID -- ARGV...   (launcher.spawn)

Why: only a process's parent learns how it ended. If that is the daemon and the daemon is killed, a
launcher that exits meanwhile (done, or crashed) leaves no trace, and the next daemon must relaunch
an attempt that may have finished — a job run to its end twice. So, like conmon for containers, a
small stdlib process sits between: it forks ARGV (the exec shim), waits for it, writes its exit
status durably to NAME in the root-owned directory DIR_FD (temp file, fsync, rename, fsync dir),
and then ends the way its child ended (same exit code, or killed by the same signal), so the daemon,
its parent, reads the status from its own Popen exactly as before.

It is the attempt's session and process-group leader (spawn starts it with a new session), so the
stored pgid names it, and it carries the attempt's SPX_ATTEMPT_ID tag, so a stop that finds the
attempt by tag reaches it too. It survives SIGTERM/SIGINT/SIGHUP (a stop signals the whole attempt:
the job takes them, the monitor outlives it to write the record) but notes that one came: only root
can signal this root process, so it was a stop by the daemon, and a daemon that did not live to
record why must not count that end against the job. SIGKILL ends it like the rest. It runs as root
(the directory is root's), hence `-I -S` and stdlib only, like enter_attempt.py.

The record is one JSON object: {"attempt_id", "exit_code", "signal", "stop_signal"}: one of
exit_code/signal is null; stop_signal is the first stop signal the attempt got, or null.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys


def write_record(dir_fd: int, name: str, record: dict) -> None:
    tmp = f".{name}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    try:
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


def main(argv: list[str]) -> int:
    dir_fd, name, attempt_id = int(argv[1]), argv[2], argv[3]
    child_argv = argv[argv.index("--") + 1:]
    os.set_inheritable(dir_fd, False)
    for sig in STOP_SIGNALS:  # handled, not ignored: a handler does not pass to the child through exec
        signal.signal(sig, _note_stop)
    pid = os.fork()
    if pid == 0:
        try:
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            os.execv(child_argv[0], child_argv)
        finally:
            os._exit(127)
    # Only the child may hold the shim's request and status pipes: its exec must be what closes them.
    os.closerange(3, dir_fd)
    os.closerange(dir_fd + 1, os.sysconf("SC_OPEN_MAX"))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    killed_by = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    try:
        write_record(dir_fd, name, {"attempt_id": attempt_id, "exit_code": code, "signal": killed_by,
                                    "stop_signal": _stop_signal[0] if _stop_signal else None})
    except OSError as e:  # a full disk: the daemon, if it is alive, still gets the status from us
        print(f"spx: cannot record the attempt's exit ({e})", file=sys.stderr)
    return end_like(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
