"""spx: submit and inspect jobs.

    spx submit [--name N] [--gpus G] [--dry-run] -- torchrun --nproc_per_node=8 train.py …
    spx submit job.yaml [--fresh]  spx ls [--json]          spx status NAME [--json] [--watch]
    spx logs NAME [--attempt N] [--job-id ID] [-f]          spx cancel NAME
    spx doctor [--json]            spx top                  spx adopt DIR   (root: host loss)
    spx hold|release NAME          spx priority NAME N      spx drain|undrain   (queue: cli/queue_cmds.py)

Works for any user and never writes the state store: `submit` drops a file into the spool (its
owner is who submits), everything else asks the daemon over its control socket, which checks the
caller's uid. Exit status: 0 ok, 1 not found or failed, 2 usage.

Here: the parser and the dispatch, and the commands that are one question to the daemon. The others
have modules of their own: submit (and submit_cmdline), logs; the daemon is asked through client,
and what `ls`, `status` and `gpus` print is render's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from spx.daemon.cli import logs, queue_cmds, render, submit_cmdline
from spx.daemon.cli.client import EXIT_FAIL, EXIT_OK, EXIT_USAGE, CliError, ask
from spx.daemon.cli.launch_cmdline import CommandLineError
from spx.daemon.cli.socket_hint import not_running_message
from spx.daemon.cli.submit import cmd_submit
from spx.daemon.core.config import ConfigError, DaemonConfig, load_config
from spx.daemon.service import control

ADOPT_TIMEOUT_SECONDS = 600.0  # a walk of a large volume, one helper process per job found


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
    else:
        render.print_gpus(rows)
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
    s.add_argument("--all", action="store_true", help="every job the daemon keeps: finished ones until config retention.finished_jobs_days")
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
            render.print_table(jobs)
            if args.all:
                print(render.retention_footer(cfg.retention.finished_jobs_days))
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
            render.print_status(doc)
        return EXIT_FAIL if doc["state"] == "failed" else EXIT_OK
    if args.command == "logs":
        return logs.cmd_logs(cfg, args)
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
