"""spx: submit and inspect jobs.

    spx submit [--name N] [--gpus G] [--dry-run] -- torchrun --nproc_per_node=8 train.py …
    spx submit job.yaml [--fresh] [--check] [--parsable|--json]
    spx ls [--all] [--me] [--user U] [--state S] [--json]   spx status NAME [--json] [--watch] [--timeline]
    spx history [--since 7d] [--attempts] [--json]
    spx logs NAME [-f] [--tail N] [--since T] [--rank R] [--attempt N] [--job-id ID]
    spx report NAME [-o FILE.svg] [--json]                   (cli/report.py: the account and its picture)
    spx cancel NAME              spx doctor [--json]         spx top [--once] [--json]    spx schema
    spx hold|release NAME        spx priority NAME N         spx drain|undrain   (queue: cli/queue_cmds.py)
    spx gpus                     spx gpu release N           spx adopt DIR   (root: host loss)
    spx incidents [NAME] [--json]   (a record per failed attempt: cli/incidents.py)

Works for any user and never writes the state store: `submit` drops a file into the spool (its
owner is who submits), everything else asks the daemon over its control socket, which checks the
caller's uid. Every command has `--json` where it prints something a script reads; the exit
statuses are one table (client.EXIT_CODES, shown by `spx --help` and docs/cli.md).

Here: the dispatch, and the commands that are one question to the daemon. The parser is parser.py;
the others have modules of their own: submit (and submit_check, submit_cmdline), history, incidents, logs,
job_schema, queue_cmds; the daemon is asked through client, and what `ls`, `status` and `gpus`
print is render's (coloured by colour.py on a terminal).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from spx.daemon.cli import (
    colour,
    filters,
    history,
    incidents,
    logs,
    queue_cmds,
    render,
    submit_cmdline,
    verify,
)
from spx.daemon.cli.client import (
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PIPE_CLOSED,
    EXIT_USAGE,
    CliError,
    ask,
)
from spx.daemon.cli.colour import Paint
from spx.daemon.cli.job_schema import cmd_schema
from spx.daemon.cli.launch_cmdline import CommandLineError
from spx.daemon.cli.parser import build_parser
from spx.daemon.cli.socket_hint import not_running_message
from spx.daemon.cli.submit import cmd_submit
from spx.daemon.core.config import ConfigError, DaemonConfig, load_config
from spx.daemon.service import control

__all__ = ["build_parser", "main", "run"]

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


def cmd_doctor(cfg: DaemonConfig, args: argparse.Namespace, paint: Paint) -> int:
    import structlog

    from spx.daemon.doctor.command import run_doctor

    # The GPU backend doctor opens logs as the daemon does: to stderr here, so stdout is the report
    # alone (`spx doctor --json | jq` parses).
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    return run_doctor(cfg, as_json=args.json, mark=paint.check)


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
    if getattr(args, "json", False) and only is None:  # `spx top --json`: one snapshot, for scripts
        queue = ask(cfg, "queue")
        drained = queue.get("drained") if isinstance(queue, dict) else None
        print(json.dumps({"jobs": ask(cfg, "ls"), "gpus": ask(cfg, "gpus"),
                          "drained": drained if isinstance(drained, str) else None}, indent=1))
        return EXIT_OK
    from spx.daemon.cli.top_command import run_top_cli

    return run_top_cli(lambda: ask(cfg, "ls"), lambda: ask(cfg, "gpus"), only=only, once=getattr(args, "once", False),
                       fetch_queue=lambda: ask(cfg, "queue"))


def cmd_ls(cfg: DaemonConfig, args: argparse.Namespace, paint: Paint) -> int:
    jobs = filters.select(ask(cfg, "history" if args.all else "ls"), args)
    if args.json:
        print(json.dumps(jobs, indent=1))
    else:
        render.print_table(jobs, paint)
        if args.all:
            print(render.retention_footer(cfg.retention.finished_jobs_days))
    return EXIT_OK


def cmd_status(cfg: DaemonConfig, args: argparse.Namespace, paint: Paint) -> int:
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
        render.print_status(doc, paint)
    return EXIT_FAIL if doc["state"] == "failed" else EXIT_OK


def cmd_report(cfg: DaemonConfig, args: argparse.Namespace) -> int:
    from spx.daemon.cli.report import run_report

    doc = ask(cfg, "status", args.name)
    assert isinstance(doc, dict)
    try:
        return run_report(doc, args, time.time())
    except OSError as e:
        raise CliError(f"cannot write the picture: {e}") from e


def run(args: argparse.Namespace) -> int:
    if args.command == "schema":  # needs no config or daemon: the job file of this version
        return cmd_schema(args)
    cfg = load_config(args.config, args.root, gpu_backend=getattr(args, "gpu_backend", None))
    paint = Paint(not getattr(args, "json", False) and colour.wanted(args.color, sys.stdout))
    if args.command == "submit":
        return cmd_submit(cfg, args)
    if args.command == "ls":
        return cmd_ls(cfg, args, paint)
    if args.command == "status":
        return cmd_status(cfg, args, paint)
    if args.command == "history":
        return history.cmd_history(cfg, args, paint)
    if args.command == "report":
        return cmd_report(cfg, args)
    if args.command == "incidents":
        return incidents.cmd_incidents(cfg, args)
    if args.command == "logs":
        return logs.cmd_logs(cfg, args)
    if args.command == "verify":
        return verify.cmd_verify(cfg, args)
    if args.command == "cancel":
        queue_cmds.print_change(args, ask(cfg, "cancel", args.name), job=args.name)
        return EXIT_OK
    if args.command == "doctor":
        return cmd_doctor(cfg, args, paint)
    if args.command == "adopt":
        return cmd_adopt(cfg, args)
    if args.command == "gpus":
        return cmd_gpus(cfg, args)
    if args.command == "gpu":
        queue_cmds.print_change(args, ask(cfg, "gpu-release", str(args.index)), gpu=args.index)
        return EXIT_OK
    if args.command in queue_cmds.COMMANDS:
        return queue_cmds.run(args, lambda op, name, arg=None: ask(cfg, op, name, arg))
    return cmd_top(cfg, args)


def main(argv: list[str] | None = None) -> int:
    try:
        code = _main(argv)
        sys.stdout.flush()  # a reader that left shows here, not as "Exception ignored" at exit
        return code
    except BrokenPipeError:
        # `spx status NAME | head`: the reader left. No traceback, and none from the flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE_CLOSED


def _main(argv: list[str] | None) -> int:
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
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
