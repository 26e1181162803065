"""`spx submit`: a job file (or, after `--`, a command line: submit_cmdline) validated here, dropped
into the spool as the submitting user, and intake's answer awaited. Before it is queued, the user is
told whether the job resumes from checkpoints already in its dir, so resuming is never a surprise.

    spx submit job.yaml               # "NAME: queued"
    spx submit --parsable job.yaml    # the job id alone (as `sbatch --parsable`), for scripts
    spx submit --json job.yaml        # {"name", "job_id", "state"}
    spx submit --check job.yaml       # validate and show what it would do; submit nothing (submit_check)

With --parsable or --json the daemon's answer is awaited longer (the id is the point): a file still
in the spool after that exits EXIT_UNCONFIRMED (3), the text form says "submitted" and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TextIO

from spx.daemon.cli import submit_check, submit_cmdline
from spx.daemon.cli.client import EXIT_FAIL, EXIT_OK, EXIT_UNCONFIRMED, EXIT_USAGE, CliError
from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.spec import MAX_SPEC_BYTES, JobSpec, SpecError, parse_spec, submitted_text
from spx.daemon.service import control
from spx.daemon.userfs import as_user
from spx.daemon.userfs.fsafe import UserPathError

# How long intake's answer is awaited: a person gets "submitted" after the short wait; a script
# asking for the id (--parsable, --json) waits for it.
ANSWER_SECONDS, ID_ANSWER_SECONDS = 5.0, 30.0


def cmd_submit(cfg: DaemonConfig, args: argparse.Namespace) -> int:
    if args.check and (args.file is None or submit_cmdline.is_command_submit(args)):
        raise CliError("--check takes a job file: `spx submit --check job.yaml` (for a command line, "
                       "`spx submit --dry-run -- COMMAND` prints its job file)", EXIT_USAGE)
    if args.parsable and args.json:
        raise CliError("give --parsable or --json, not both", EXIT_USAGE)
    if submit_cmdline.is_command_submit(args):
        return submit_cmdline.submit_command(cfg, args, lambda spec, text: drop(cfg, spec, text, args, "the command line"))
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
    if args.check:
        return submit_check.check_job(cfg, spec, source, args.json)
    return drop(cfg, spec, text, args, str(source))


def drop(cfg: DaemonConfig, spec: JobSpec, text: str, args: argparse.Namespace, origin: str) -> int:
    """Drop a validated job file into the spool (a dotfile renamed in) and report intake's answer;
    a rejection is said of `origin` (the user's file), not of the spool's copy. (`spx verify` drops
    its replay's file here too: a replay resumes nothing of its own, so nothing is said of resuming.)"""
    quiet = args.parsable or args.json  # stdout is the answer alone; what a person reads goes to stderr
    if spec.replay is None:
        _say_what_resumes(cfg, spec, sys.stderr if quiet else sys.stdout)
    final = f"{spec.name}-{time.time_ns()}.yaml"
    tmp = cfg.spool_dir / f".{final}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.rename(tmp, cfg.spool_dir / final)
    except OSError as e:
        raise CliError(f"cannot drop the job into {cfg.spool_dir}: {e.strerror}") from e
    answer = _await_intake(cfg, spec.name, final, ID_ANSWER_SECONDS if quiet else ANSWER_SECONDS)
    if isinstance(answer, str):  # rejected: intake's reason
        print(rejection_text(answer, final, origin), file=sys.stderr)
        return EXIT_FAIL
    if answer is None:
        where = cfg.spool_dir / final
        if quiet:
            print(f"spx submit: {spec.name} is in the spool ({where}) but no daemon took it within "
                  f"{ID_ANSWER_SECONDS:g} s: no job id yet; it is queued when the daemon runs", file=sys.stderr)
            return EXIT_UNCONFIRMED
        print(f"{spec.name}: submitted ({where}); the daemon will pick it up when it runs")
        return EXIT_OK
    if args.parsable:
        print(answer.get("job_id"))
    elif args.json:
        print(json.dumps({"name": spec.name, "job_id": answer.get("job_id"), "state": answer["state"],
                          "owner": answer.get("owner")}, indent=1))
    else:
        print(f"{spec.name}: {answer['state']}")
    return EXIT_OK


def _say_what_resumes(cfg: DaemonConfig, spec: JobSpec, out: TextIO) -> None:
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
        _say_legacy_dir(cfg, spec, me, ckpt_dir, out)
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
              f"they are moved into {ckpt_dir}/.before-job-ID at its start", file=out)
    else:
        print(f"{ckpt_dir} holds checkpoints {upto} from {who}; this job resumes from them (--fresh to start over)",
              file=out)


def _say_legacy_dir(cfg: DaemonConfig, spec: JobSpec, me: as_user.Owner, ckpt_dir: Path, out: TextIO) -> None:
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
              f"this job's dir is {ckpt_dir}: to resume from them, set checkpoints.dir: {legacy}", file=out)


def _await_intake(cfg: DaemonConfig, name: str, spool_name: str, timeout: float) -> dict | str | None:
    """Intake's answer: the job's status document once it is queued, its reason when rejected (the
    rejected file's text), None when nothing answered within `timeout` (no daemon, or a slow one)."""
    deadline = time.monotonic() + timeout
    error_file = cfg.rejected_dir / f"{spool_name}.error"
    while time.monotonic() < deadline:
        if error_file.exists():
            return error_file.read_text().rstrip()
        if not (cfg.spool_dir / spool_name).exists():
            try:
                doc = control.request(cfg.socket_path, "status", name)
                if doc.get("ok"):
                    return dict(doc["result"])
            except OSError:
                break
        time.sleep(0.05)
    return None


def rejection_text(error_text: str, spool_name: str, origin: str) -> str:
    """Intake's `.error` names the file it found in the spool: for `spx submit` that is a copy under
    a generated name the user never saw, so the first line is said of the user's file instead."""
    first, _, rest = error_text.rstrip().partition("\n")
    if first.startswith(f"{spool_name}: "):
        first = f"{origin}: {first[len(spool_name) + 2:]}"
    return f"{first}\n{rest}" if rest else first
