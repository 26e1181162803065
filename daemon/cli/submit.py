"""`spx submit`: a job file (or, after `--`, a command line: submit_cmdline) validated here, dropped
into the spool as the submitting user, and intake's answer awaited. Before it is queued, the user is
told whether the job resumes from checkpoints already in its dir, so resuming is never a surprise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from spx.daemon.cli import submit_cmdline
from spx.daemon.cli.client import EXIT_FAIL, EXIT_OK, EXIT_USAGE, CliError
from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.spec import MAX_SPEC_BYTES, JobSpec, SpecError, parse_spec, submitted_text
from spx.daemon.service import control
from spx.daemon.userfs import as_user
from spx.daemon.userfs.fsafe import UserPathError


def cmd_submit(cfg: DaemonConfig, args: argparse.Namespace) -> int:
    if submit_cmdline.is_command_submit(args):
        return submit_cmdline.submit_command(cfg, args, lambda spec, text: _drop(cfg, spec, text, "the command line"))
    source = Path(args.file)
    try:
        with open(source, "rb") as f:
            raw = f.read(MAX_SPEC_BYTES + 1)  # parse_spec refuses more; never read a huge file whole
        text = raw.decode()
    except OSError as e:
        raise CliError(f"{source}: {e.strerror}", EXIT_USAGE) from e
    except UnicodeDecodeError as e:
        raise CliError(f"{source}: not UTF-8 text (byte {e.start}); a job file is YAML text", EXIT_USAGE) from e
    try:
        spec = parse_spec(text, source.parent)
        text = submitted_text(text, source.parent, str(source), fresh=args.fresh)
        if args.fresh:
            spec = parse_spec(text)
    except SpecError as e:
        raise CliError(e.render(str(source)), EXIT_USAGE) from e
    return _drop(cfg, spec, text, str(source))


def _drop(cfg: DaemonConfig, spec: JobSpec, text: str, origin: str) -> int:
    """Drop a validated job file into the spool (a dotfile renamed in) and report intake's answer;
    a rejection is said of `origin` (the user's file), not of the spool's copy."""
    _say_what_resumes(cfg, spec)
    final = f"{spec.name}-{time.time_ns()}.yaml"
    tmp = cfg.spool_dir / f".{final}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.rename(tmp, cfg.spool_dir / final)
    except OSError as e:
        raise CliError(f"cannot drop the job into {cfg.spool_dir}: {e.strerror}") from e
    return _await_intake(cfg, spec.name, final, origin)


def _say_what_resumes(cfg: DaemonConfig, spec: JobSpec) -> None:
    """Whether the job starts from checkpoints already in its dir (a reused name finds the earlier
    job's): said before it is queued, so resuming is never a surprise. Read as the submitting user
    (the job's owner); a dir they cannot read says nothing here (intake judges it). The default dir
    is per owner (`checkpoints_root/OWNER/NAME`): a dir of that name from before (`checkpoints_root/
    NAME`, theirs) is named, so the job does not start over in the new one unnoticed."""
    try:
        me = as_user.owner(os.getuid())
    except UserPathError:
        return
    ckpt_dir = spec.with_checkpoint_dir(cfg.checkpoints_root, me.name, me.uid).checkpoint_dir(cfg.checkpoints_root)
    if spec.checkpoints.dir is None:
        _say_legacy_dir(cfg, spec, me, ckpt_dir)
    try:  # as the daemon will find it, in a helper with a timeout (a hung mount costs 5 s, not forever)
        found = as_user.find_latest(as_user.owner(os.getuid()), str(ckpt_dir), spec.checkpoints.pattern, 5.0)
    except UserPathError:
        return
    mode = spec.checkpoints.resume
    if found.get("path") is None:
        if mode == "require":
            print(f"{spec.name}: checkpoints.resume is require, but {ckpt_dir} holds no complete checkpoint "
                  "(yet): the job fails at its start unless one is there by then", file=sys.stderr)
        return
    step, path = found.get("step"), Path(str(found.get("path")))
    upto = f"up to step {step}" if isinstance(step, int) else f"({path.name})"
    try:
        earlier = control.request(cfg.socket_path, "status", spec.name, timeout=5.0)
    except OSError:
        earlier = {}
    who = f"an earlier job {spec.name}" if earlier.get("ok") else "an earlier job"
    if mode == "never":
        print(f"{ckpt_dir} holds checkpoints {upto} from {who}; this job starts fresh (checkpoints.resume: never): "
              f"they are moved into {ckpt_dir}/.before-job-ID at its start")
    else:
        print(f"{ckpt_dir} holds checkpoints {upto} from {who}; this job resumes from them (--fresh to start over)")


def _say_legacy_dir(cfg: DaemonConfig, spec: JobSpec, me: as_user.Owner, ckpt_dir: Path) -> None:
    """`checkpoints_root/NAME`, this user's, holds checkpoints of an earlier job of this name (the
    default dir before it was per owner): say so, and how to resume from them."""
    legacy = cfg.checkpoints_root / spec.name
    try:
        if legacy.lstat().st_uid != me.uid:
            return
        found = as_user.find_latest(me, str(legacy), spec.checkpoints.pattern, 5.0)
    except (OSError, UserPathError):
        return
    if found.get("path") is not None:
        print(f"{legacy} holds checkpoints of an earlier {spec.name} (the default dir before it was per owner); "
              f"this job's dir is {ckpt_dir}: to resume from them, set checkpoints.dir: {legacy}")


def _await_intake(cfg: DaemonConfig, name: str, spool_name: str, origin: str, timeout: float = 5.0) -> int:
    deadline = time.monotonic() + timeout
    error_file = cfg.rejected_dir / f"{spool_name}.error"
    while time.monotonic() < deadline:
        if error_file.exists():
            print(rejection_text(error_file.read_text(), spool_name, origin), file=sys.stderr)
            return EXIT_FAIL
        if not (cfg.spool_dir / spool_name).exists():
            try:
                doc = control.request(cfg.socket_path, "status", name)
                if doc.get("ok"):
                    print(f"{name}: {doc['result']['state']}")
                    return EXIT_OK
            except OSError:
                break
        time.sleep(0.05)
    print(f"{name}: submitted ({cfg.spool_dir / spool_name}); the daemon will pick it up when it runs")
    return EXIT_OK


def rejection_text(error_text: str, spool_name: str, origin: str) -> str:
    """Intake's `.error` names the file it found in the spool: for `spx submit` that is a copy under
    a generated name the user never saw, so the first line is said of the user's file instead."""
    first, _, rest = error_text.rstrip().partition("\n")
    if first.startswith(f"{spool_name}: "):
        first = f"{origin}: {first[len(spool_name) + 2:]}"
    return f"{first}\n{rest}" if rest else first
