"""Fencing: an attempt whose job's lease another host took publishes no checkpoint.

A one-host job's lease is `CHECKPOINT_DIR/.spx/lease`, written by the daemons (as the job's owner,
userfs/spx_dir.py) only under an exclusive `flock` of `.spx/lease.lock`, held for the
read-check-write alone (userfs/cas.py). Each time a daemon takes the lease its generation grows by
one, and the attempt it launches gets that generation as `SPX_FENCE` (the fencing token).

Before a worker publishes a checkpoint as complete (the rename that makes it "latest") it takes a
*shared* flock of the same lock file, reads the lease, and goes on only while the lease's
generation is still its token — and keeps the shared lock until the rename is done, so no daemon
can take the lease between the check and the publish. A worker whose lease another host took (that
host adopted the job while this one could not renew it: a partition, a hung volume, a daemon
stopped) publishes nothing, says why, and exits with `worker_env.EXIT_FENCED`.

What it reads is the owner's: `.spx/`, the lock file and the lease must belong to the process's own
user and `.spx/` must be writable by nobody else, as the daemon requires; anything else is no lease.
A volume whose `flock` does not work (NFSv3 without lockd, Lustre without `-o flock`) cannot fence:
it is refused here as in the daemon (`spx doctor` checks the checkpoints root).

Stdlib only: `spx.trainer` imports it in the workers, the daemon shares its names and lock rule.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from spx.daemon.contract.worker_env import ENV_CHECKPOINT_DIR, ENV_FENCE

SPX_DIR = ".spx"
LEASE = "lease"
LEASE_LOCK = "lease.lock"
LOCK_WAIT_SECONDS = 10.0
RECORD_MAX_BYTES = 4096
MAX_GENERATION = 2**53
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class LocksUnsupported(OSError):
    """The file system refuses `flock`: no compare-and-swap and no fencing are possible on it."""


class Fenced(Exception):
    """This attempt's lease is not its own any more (or cannot be verified): nothing may be published."""


def flock_within(fd: int, exclusive: bool, wait: float, what: str,
                 clock: Callable[[], float] = time.monotonic, pause: Callable[[float], None] = time.sleep) -> None:
    """`flock` `fd` (exclusive or shared), trying for up to `wait` seconds: another daemon or worker
    holds it for the milliseconds of a read-check-write. TimeoutError past that; LocksUnsupported on
    a file system without locks."""
    deadline = clock() + wait
    while True:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if clock() >= deadline:
                raise TimeoutError(f"{what} stayed locked by another process for over {wait:g} s") from None
            pause(0.005)
        except OSError as e:
            if e.errno in _NO_LOCKS:
                raise LocksUnsupported(e.errno, f"{what}: this file system does not support flock (its mount "
                                                "needs working locks; see `spx doctor`)") from None
            raise


def private_problem(st: os.stat_result, what: str) -> str | None:
    """Why `what` (fstat `st`) is not this user's own, writable by nobody else; None if it is."""
    me = os.geteuid()
    if st.st_uid != me:
        return (f"{what} belongs to uid {st.st_uid}, not to the job's owner (uid {me}): another user made it "
                "or put it there")
    if stat.S_ISDIR(st.st_mode) and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{what} is writable by others than its owner (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def generation_of(raw: bytes | None) -> int | None:
    """The `gen` of a lease (or any record of the compare-and-swap); None if absent or not one."""
    if raw is None:
        return None
    try:
        doc = json.loads(raw[:RECORD_MAX_BYTES])
    except (ValueError, RecursionError):
        return None
    gen = doc.get("gen") if isinstance(doc, dict) else None
    return gen if isinstance(gen, int) and not isinstance(gen, bool) and 0 <= gen < MAX_GENERATION else None


@dataclass(frozen=True)
class Fence:
    """The lease generation an attempt was launched with (`SPX_FENCE`), in its checkpoint dir."""

    checkpoint_dir: Path
    token: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Fence | None:
        """The attempt's fence; None when it was launched without one (by hand, or a job across
        hosts: those restart together through `.spx-gang/`, not a lease). A token that is not a
        number is a fence nothing matches."""
        raw, ckpt = env.get(ENV_FENCE, "").strip(), env.get(ENV_CHECKPOINT_DIR, "").strip()
        if not raw or not ckpt:
            return None
        try:
            token = int(raw)
        except ValueError:
            token = -1
        return cls(Path(ckpt), token)

    @contextmanager
    def held(self, wait: float = LOCK_WAIT_SECONDS) -> Iterator[None]:
        """Inside: the lease is still this attempt's, and stays so (a shared flock of its lock).
        Raises Fenced, with why, when it is not (or cannot be read in `wait` seconds)."""
        fds: list[int] = []
        try:
            try:
                spx = _open(str(self.checkpoint_dir / SPX_DIR), _DIR_FLAGS, fds)
                problem = private_problem(os.fstat(spx), f"{self.checkpoint_dir}/{SPX_DIR}")
                if problem:
                    raise Fenced(problem)
                lock = _open(LEASE_LOCK, os.O_RDONLY | _FILE_FLAGS, fds, spx)
                flock_within(lock, exclusive=False, wait=wait, what=f"{SPX_DIR}/{LEASE_LOCK}")
                gen = generation_of(_read_own(spx, LEASE, fds))
            except (OSError, TimeoutError) as e:
                raise Fenced(f"the lease in {self.checkpoint_dir}/{SPX_DIR} cannot be verified: {e}") from None
            if gen != self.token:
                now = "no lease" if gen is None else f"generation {gen}"
                raise Fenced(f"this attempt was launched with lease generation {self.token}, the lease in "
                             f"{self.checkpoint_dir}/{SPX_DIR} is at {now}: another host took the job over")
            yield
        finally:
            for fd in reversed(fds):
                os.close(fd)  # the lock goes with its fd


def _open(name: str, flags: int, fds: list[int], dir_fd: int | None = None) -> int:
    fd = os.open(name, flags, dir_fd=dir_fd)
    fds.append(fd)
    return fd


def _read_own(spx: int, name: str, fds: list[int]) -> bytes | None:
    """The regular file `name` of this user in `spx`, capped; None if absent."""
    try:
        fd = _open(name, os.O_RDONLY | _FILE_FLAGS, fds, spx)
    except FileNotFoundError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        raise OSError(errno.EPERM, f"{SPX_DIR}/{name} is not a regular file of the job's owner")
    return os.read(fd, RECORD_MAX_BYTES + 1)
