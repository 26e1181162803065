"""spx: submit and inspect jobs.

    spx submit [--name N] [--gpus G] [--dry-run] -- torchrun --nproc_per_node=8 train.py …
    spx submit job.yaml [--fresh]  spx ls [--json]          spx status NAME [--json] [--watch]
    spx logs NAME [--attempt N] [--job-id ID] [-f]          spx cancel NAME
    spx doctor [--json]            spx top                  spx adopt DIR   (root: host loss)
    spx hold|release NAME          spx priority NAME N      spx drain|undrain   (queue: cli/queue_cmds.py)

Works for any user and never writes the state store: `submit` drops a file into the spool (its
owner is who submits), everything else asks the daemon over its control socket, which checks the
caller's uid. Exit status: 0 ok, 1 not found or failed, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from spx.daemon.cli import queue_cmds, submit_cmdline
from spx.daemon.cli.launch_cmdline import CommandLineError
from spx.daemon.cli.socket_hint import not_running_message
from spx.daemon.contract import checkpoint_discovery
from spx.daemon.core.causes import NOT_FAILURES
from spx.daemon.core.config import ConfigError, DaemonConfig, load_config
from spx.daemon.core.spec import MAX_SPEC_BYTES, JobSpec, SpecError, parse_spec, submitted_text
from spx.daemon.service import control
from spx.daemon.state import node_view
from spx.daemon.userfs import as_user
from spx.daemon.userfs.fsafe import UserPathError

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
ADOPT_TIMEOUT_SECONDS = 600.0  # a walk of a large volume, one helper process per job found


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAIL):
        super().__init__(message)
        self.code = code


def ask(cfg: DaemonConfig, op: str, name: str | None = None, arg: str | None = None) -> object:
    """Ask the daemon; if it is not running, root may still read the store directly."""
    try:
        reply = control.request(cfg.socket_path, op, name, arg=arg)
    except TimeoutError as e:  # something listens there but did not answer whole in time
        raise CliError(f"{e}; the daemon may be overloaded (see its log)") from e
    except OSError:
        return _ask_store(cfg, op, name)
    if not reply.get("ok"):
        raise CliError(reply.get("error", "request failed"), reply.get("code", EXIT_FAIL))
    return reply["result"]


def _ask_store(cfg: DaemonConfig, op: str, name: str | None) -> object:
    if op in ("cancel", "gpu-release", *queue_cmds.COMMANDS, "queue") or not os.access(cfg.store_path, os.R_OK):
        raise CliError(not_running_message(cfg))
    if op == "gpus":
        return []  # the GPUs a daemon uses: none while it is not running
    from spx.daemon.state import jobviews  # only on this fallback path: keeps `spx` quick to start
    from spx.daemon.state.db import StoreRefused
    from spx.daemon.state.store import Store

    try:
        store = Store(cfg.store_path, readonly=True)
    except StoreRefused as e:  # a store a newer version wrote: say so, not a traceback
        raise CliError(str(e)) from None
    try:
        if op in ("ls", "history"):
            return [v.to_json() for v in jobviews.all_views(store, cfg.run_dir, scope="all" if op == "history" else "recent")]
        job = store.jobs.by_name(name or "")
        if job is None:
            raise CliError(f"no job named {name!r}")
        return jobviews.job_view(store, job, cfg.run_dir, with_history=True).to_json(with_history=True)
    finally:
        store.close()


def _ago(t: float | None, now: float) -> str:
    if t is None:
        return "-"
    s = max(0, int(now - t))
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


def _fmt(v: object) -> str:
    return "-" if v is None or v == [] else ",".join(map(str, v)) if isinstance(v, list) else str(v)


def print_table(jobs: list[dict]) -> None:
    now = time.time()
    rows = [("NAME", "JOB", "STATE", "ATTEMPTS", "STEP", "CKPT", "CKPT AGE", "GPUS", "REASON")]
    for j in jobs:
        rows.append((j["name"], str(j.get("job_id", "-")), j["state"], str(j["attempts"]), _fmt(j["step"]), _fmt(j["last_checkpoint_step"]),
                     _ago(j.get("last_checkpoint_time"), now), _fmt(j["gpus"]), j["reason"] or ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])



def print_status(doc: dict) -> None:
    print(f"{doc['name']}: {doc['state']}" + (f" ({doc['reason']})" if doc["reason"] else ""))
    print(f"  owner {doc['owner']}  gpus {_fmt(doc['gpus'])}  step {_fmt(doc['step'])}  "
          f"last checkpoint {_fmt(doc['last_checkpoint_step'])}  samples/s {_fmt(doc['samples_per_second'])}")
    if doc.get("heartbeat_problem"):
        print(f"  heartbeat unreadable: {doc['heartbeat_problem']}")
    if doc.get("node"):
        for line in node_view.describe(doc["node"], time.time()):
            print(f"  {line}")
    if doc.get("staging"):
        print(f"  staging: {doc['staging']}")
    history = doc.get("history", [])
    failed = [a for a in history if a.get("reason_class") and a["reason_class"] not in NOT_FAILURES]
    if failed:
        # The operator's one line: the latest failure's class and cause.
        last = failed[-1]
        print(f"  last failure (attempt {last['number']}): {last['reason_class']}: {last.get('root_cause') or last['reason']}")
    for a in history:
        start = time.strftime("%H:%M:%S", time.localtime(a["start"])) if a["start"] else "-"
        end = time.strftime("%H:%M:%S", time.localtime(a["end"])) if a["end"] else "running"
        resumed = f"resumed from step {a['resumed_from_step']}" if a["resumed_from_step"] is not None else "fresh start"
        reason = a["reason"] or ""
        cancelled = reason.startswith("cancelled")
        if cancelled and a["end"]:
            # A user's decision, not a failure: who and when, and what it kept (the last attempt's
            # checkpoint is the job's newest one).
            ckpt = doc["last_checkpoint_step"] if a is history[-1] else None
            reason += f" at {end}" + (f" (checkpoint at step {ckpt})" if ckpt is not None else " (no checkpoint)")
        cls = a.get("reason_class")
        tag = f" [{cls}]" if cls and not cancelled else ""
        print(f"  attempt {a['number']}: {start} → {end}  {resumed}  {reason}{tag}")
        if a.get("root_cause") and not cancelled:
            print(f"      root cause: {a['root_cause']}")
        for line in checkpoint_discovery.describe(a["checkpoint"]) if a.get("checkpoint") else ():
            print(f"      checkpoint: {line}")


def cmd_submit(cfg: DaemonConfig, args: argparse.Namespace) -> int:
    if submit_cmdline.is_command_submit(args):
        return submit_cmdline.submit_command(cfg, args, lambda spec, text: _drop(cfg, spec, text))
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
    return _drop(cfg, spec, text)


def _drop(cfg: DaemonConfig, spec: JobSpec, text: str) -> int:
    """Drop a validated job file into the spool (a dotfile renamed in) and report intake's answer."""
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
    return _await_intake(cfg, spec.name, final)


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


def _await_intake(cfg: DaemonConfig, name: str, spool_name: str, timeout: float = 5.0) -> int:
    deadline = time.monotonic() + timeout
    error_file = cfg.rejected_dir / f"{spool_name}.error"
    while time.monotonic() < deadline:
        if error_file.exists():
            print(error_file.read_text().rstrip(), file=sys.stderr)
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


def cmd_logs(cfg: DaemonConfig, args: argparse.Namespace) -> int:
    doc = ask(cfg, "status", args.name)
    assert isinstance(doc, dict)
    current = args.job_id is None or args.job_id == doc.get("job_id")
    log_dir = cfg.log_dir / args.name if current else _earlier_log_dir(cfg, args.name, args.job_id)
    if not current and not log_dir.is_dir():
        raise CliError(f"no logs of a job {args.job_id} named {args.name} (looked for {log_dir}); "
                       f"the ids are in `spx ls --all`")
    number = args.attempt or (doc["attempts"] if current else _attempts_in(log_dir))
    if not number:
        raise CliError(f"{args.name} has not started an attempt yet")
    path = log_dir / f"attempt-{number}.log"
    try:
        f = path.open("rb")
    except OSError as e:
        raise CliError(_missing_log_message(cfg, args.name, doc, path, e) if current else f"{path}: {e.strerror}") from e
    with f:
        while True:
            chunk = f.read(65536)
            if chunk:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
                continue
            if not args.follow or not current:
                return EXIT_OK
            now = ask(cfg, "status", args.name)
            assert isinstance(now, dict)
            if now["state"] in ("succeeded", "failed", "cancelled") or now["attempts"] != number:
                return EXIT_OK
            time.sleep(0.5)


def _earlier_log_dir(cfg: DaemonConfig, name: str, job_id: int) -> Path:
    """Where the daemon moved an earlier job's logs when its name was reused (`log/NAME.job-ID`)."""
    return cfg.log_dir / f"{name}.job-{job_id}"


def _attempts_in(log_dir: Path) -> int:
    try:
        return max((int(p.stem.removeprefix("attempt-")) for p in log_dir.glob("attempt-*.log")
                    if p.stem.removeprefix("attempt-").isdigit()), default=0)
    except OSError:
        return 0


def _missing_log_message(cfg: DaemonConfig, name: str, doc: dict, path: Path, e: OSError) -> str:
    """A missing attempt log, with where the earlier jobs of a reused name keep theirs."""
    message = f"{path}: {e.strerror}; job {doc.get('job_id', '?')} named {name} has {doc['attempts']} attempt(s)"
    earlier = []
    for d in sorted(cfg.log_dir.glob(f"{name}.job-*")):
        job_id = d.name.removeprefix(f"{name}.job-")
        if job_id.isdigit():
            earlier.append(f"job {job_id}: {d} ({_attempts_in(d)} attempt(s))")
    if earlier:
        message += (f"\nearlier jobs named {name} keep their logs aside: " + "; ".join(earlier)
                    + f"\nread one with `spx logs {name} --job-id ID --attempt N` (ids: `spx ls --all`)")
    return message


def cmd_adopt(cfg: DaemonConfig, args: argparse.Namespace) -> int:
    """One line per job record found under DIR: queued, or why not (already here, ended, held by a
    live host, refused). Exit 1 if any record was refused."""
    try:
        reply = control.request(cfg.socket_path, "adopt", str(args.dir.absolute()), timeout=ADOPT_TIMEOUT_SECONDS)
    except OSError as e:
        raise CliError(not_running_message(cfg)) from e
    if not reply.get("ok"):
        raise CliError(reply.get("error", "adopt failed"), reply.get("code", EXIT_FAIL))
    results = reply["result"]
    if args.json:
        print(json.dumps(results, indent=1))
    elif not results:
        print(f"no job records (*/.spx/job.yaml) under {args.dir}")
    for r in [] if args.json else results:
        print(f"{r['result']:8}  {r.get('name') or '-'}  {r['dir']}: {r['detail']}")
    return EXIT_FAIL if any(r["result"] == "refused" for r in results) else EXIT_OK


def cmd_doctor(cfg: DaemonConfig, args: argparse.Namespace) -> int:
    from spx.daemon.doctor.command import run_doctor

    return run_doctor(cfg, as_json=args.json)


def cmd_gpus(cfg: DaemonConfig, args: argparse.Namespace) -> int:
    """`spx gpus`: index, name and UUID, the job on it, health, and why it is quarantined."""
    rows = ask(cfg, "gpus")
    assert isinstance(rows, list)
    if args.json:
        print(json.dumps(rows, indent=1))
        return EXIT_OK
    print(f"{'GPU':<4} {'NAME':<24} {'UUID':<42} {'JOB':<20} {'HEALTH':<12} QUARANTINE")
    for r in rows:
        health = "quarantined" if r.get("quarantine") else r.get("health", "ok")
        print(f"{r['index']:<4} {r['name'][:24]:<24} {(r.get('uuid') or '-'):<42} {(r.get('job') or '-')[:20]:<20} "
              f"{health:<12} {r.get('quarantine') or ''}")
    return EXIT_OK


def cmd_top(cfg: DaemonConfig, args: argparse.Namespace, only: str | None = None) -> int:
    from spx.daemon.cli.top_command import run_top_cli

    return run_top_cli(lambda: ask(cfg, "ls"), lambda: ask(cfg, "gpus"), only=only, once=getattr(args, "once", False),
                       fetch_queue=lambda: ask(cfg, "queue"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spx", description="Submit and inspect spx-trainer jobs.")
    p.add_argument("--root", type=Path, help=(
        "the daemon's --root (or set SPX_ROOT): spx talks to DIR/run/spx.sock, else to the config's run_dir "
        "(default /run/spx/spx.sock) and nowhere else. When no daemon answers there, a ./*/run/spx.sock that "
        "answers is suggested, but only one that you or root own, in directories no one else can write "
        "(when root runs spx: root's alone); another user's socket is never connected to"))
    p.add_argument("--config", type=Path, help="the daemon's config file")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("submit", help="drop a job file (or, after --, a torchrun/deepspeed/python command line) "
                                      "into the spool")
    s.add_argument("file", nargs="?")
    submit_cmdline.add_arguments(s)
    s.add_argument("--fresh", action="store_true",
                   help="do not resume from checkpoints already in the job's checkpoint dir (checkpoints.resume: never)")
    s = sub.add_parser("ls", help="live jobs, and each name's latest job if it ended in the last 24 h")
    s.add_argument("--json", action="store_true")
    s.add_argument("--all", action="store_true", help="every job ever submitted, however long ago it ended")
    s = sub.add_parser("status", help="one job, with its attempts")
    s.add_argument("name")
    s.add_argument("--json", action="store_true")
    s.add_argument("--watch", action="store_true", help="live view, refreshing in place")
    s.add_argument("--timeline", action="store_true", help="where each attempt's (re)start spent its time")
    s = sub.add_parser("logs", help="an attempt's log")
    s.add_argument("name")
    s.add_argument("--attempt", type=int)
    s.add_argument("--job-id", type=int, help="an earlier job of a reused name (its id: `spx ls --all`)")
    s.add_argument("-f", "--follow", action="store_true")
    s = sub.add_parser("cancel", help="stop a job (it gets its grace period to checkpoint)")
    s.add_argument("name")
    s = sub.add_parser("adopt", help="root: queue the unfinished jobs another (lost) host left under DIR "
                                     "(CHECKPOINT_DIR/.spx/job.yaml); each resumes from its latest checkpoint")
    s.add_argument("dir", type=Path)
    s.add_argument("--json", action="store_true")
    s = sub.add_parser("doctor", help="check this host against what training needs")
    s.add_argument("--json", action="store_true")
    s.add_argument("--gpu-backend", choices=["auto", "nvml", "fake", "none"], help="as for spx-trainer")
    s = sub.add_parser("gpus", help="the daemon's GPUs: the job on each, its health and quarantine")
    s.add_argument("--json", action="store_true")
    s = sub.add_parser("gpu", help="root/admin: release a quarantined GPU (`spx gpu release N`)")
    s.add_argument("action", choices=["release"])
    s.add_argument("index", type=int)
    queue_cmds.add_parsers(sub)
    s = sub.add_parser("top", help="live view of jobs and GPUs")
    s.add_argument("--once", action="store_true", help="print one frame and exit")
    return p


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.root, gpu_backend=getattr(args, "gpu_backend", None))
    if args.command == "submit":
        return cmd_submit(cfg, args)
    if args.command == "ls":
        jobs = ask(cfg, "history" if args.all else "ls")
        assert isinstance(jobs, list)
        if args.json:
            print(json.dumps(jobs, indent=1))
        else:
            print_table(jobs)
        return EXIT_OK
    if args.command == "status":
        if args.watch:
            return cmd_top(cfg, args, only=args.name)
        doc = ask(cfg, "status", args.name)
        assert isinstance(doc, dict)
        if args.timeline:
            from spx.daemon.cli import timeline
            print(json.dumps(timeline.rows(doc), indent=1) if args.json else timeline.render(doc))
        elif args.json:
            print(json.dumps(doc, indent=1))
        else:
            print_status(doc)
        return EXIT_FAIL if doc["state"] == "failed" else EXIT_OK
    if args.command == "logs":
        return cmd_logs(cfg, args)
    if args.command == "cancel":
        print(ask(cfg, "cancel", args.name))
        return EXIT_OK
    if args.command == "doctor":
        return cmd_doctor(cfg, args)
    if args.command == "adopt":
        return cmd_adopt(cfg, args)
    if args.command == "gpus":
        return cmd_gpus(cfg, args)
    if args.command == "gpu":
        print(ask(cfg, "gpu-release", str(args.index)))
        return EXIT_OK
    if args.command in queue_cmds.COMMANDS:
        return queue_cmds.run(args, lambda op, name, arg=None: ask(cfg, op, name, arg))
    return cmd_top(cfg, args)


def main(argv: list[str] | None = None) -> int:
    argv, launch_argv = submit_cmdline.split_command(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.launch_argv = launch_argv  # `spx submit … -- COMMAND`: the command line, kept from argparse
    try:
        return run(args)
    except (ConfigError, CommandLineError) as e:
        print(f"spx: {e}", file=sys.stderr)
        return EXIT_USAGE
    except CliError as e:
        print(f"spx: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
