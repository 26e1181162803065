"""`spx`'s command line: every command, option and its help text, and the exit statuses `spx --help`
lists (client.EXIT_CODES).

The global options (`--root`, `--config`, `--color`) are accepted before or after the subcommand
(`spx --root X submit job.yaml` and `spx submit job.yaml --root X` alike): each subcommand gets them
too, with SUPPRESS defaults, so one not given after the subcommand leaves the value given before it.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from spx.daemon.cli import colour, filters, history, incidents, queue_cmds, report, submit_cmdline, verify
from spx.daemon.cli.client import EXIT_CODES
from spx.daemon.core.version import daemon_version

ROOT_HELP = (
    "the daemon's --root (default: $SPX_ROOT, else the config's paths): spx talks to DIR/run/spx.sock, else to "
    "the config's run_dir (default /run/spx/spx.sock) and nowhere else. When no daemon answers there, a "
    "./*/run/spx.sock that answers is suggested, but only one that you or root own, in directories no one else "
    "can write (when root runs spx: root's alone); another user's socket is never connected to")
JSON_HELP = "print the answer as JSON (docs/cli.md has its shape), for scripts"


def exit_codes_epilog() -> str:
    codes = "\n".join(textwrap.fill(text, 100, initial_indent=f"  {code:<4} ", subsequent_indent=" " * 7)
                      for code, text in EXIT_CODES)
    return "exit status:\n" + codes + (
        "\n\nenvironment:\n"
        "  SPX_ROOT   the daemon's --root, when --root is not given\n"
        "  NO_COLOR   set (to anything but \"\"): no colour, as --color never\n\n"
        "Global options (--root, --config, --color) may come before or after the command. "
        "Reference: docs/cli.md.")


def _global_options(p: argparse.ArgumentParser, on_subcommand: bool) -> None:
    """The top parser's with real defaults; each subcommand's with SUPPRESS ones (see module doc)."""
    unset = argparse.SUPPRESS if on_subcommand else None
    p.add_argument("--root", type=Path, default=unset, metavar="DIR",
                   help="the daemon's --root (default: $SPX_ROOT; `spx --help` says more)" if on_subcommand
                   else ROOT_HELP)
    p.add_argument("--config", type=Path, default=unset, metavar="FILE",
                   help="the daemon's config file (default /etc/spx/config.yaml where it exists)")
    p.add_argument("--color", "--colour", choices=colour.MODES, default=unset or "auto",
                   help="colour job states and doctor's verdicts: auto (on a terminal, unless NO_COLOR is set), "
                        "always, never (default auto)")


def _command(sub: argparse._SubParsersAction, name: str, text: str,
             parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=text, description=text, parents=parents)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spx", description="Submit and inspect spx-trainer jobs.",
                                epilog=exit_codes_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"spx {daemon_version()}")
    _global_options(p, on_subcommand=False)
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, on_subcommand=True)
    parents = [common]
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = _command(sub, "submit", "drop a job file (or, after --, a torchrun/deepspeed/python command line) into "
                                "the spool", parents)
    s.add_argument("file", nargs="?", help="the job file (YAML; `spx schema` gives its JSON Schema)")
    submit_cmdline.add_arguments(s)
    s.add_argument("--fresh", action="store_true",
                   help="do not resume from checkpoints already in the job's checkpoint dir (checkpoints.resume: never)")
    s.add_argument("--check", action="store_true",
                   help="validate the job file, print it as the daemon would record it and what it would do; "
                        "submit nothing")
    s.add_argument("--parsable", action="store_true", help="print the job id alone (as sbatch --parsable)")
    s.add_argument("--json", action="store_true", help="print {name, job_id, state, owner} (with --check: the check)")

    s = _command(sub, "ls", "live jobs, and each name's latest job if it ended in the last 24 h", parents)
    s.add_argument("--all", action="store_true", help="every job the daemon keeps: finished ones until the config's retention.finished_jobs_days")
    filters.add_arguments(s)
    s.add_argument("--json", action="store_true", help=JSON_HELP)

    s = _command(sub, "status", "one job, with its attempts", parents)
    s.add_argument("name", help="the job's name")
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s.add_argument("--watch", action="store_true", help="live view, refreshing in place")
    s.add_argument("--timeline", action="store_true", help="where each attempt's (re)start spent its time")

    s = _command(sub, "report", "where a job's time went: its account (goodput, time lost by cause), one line "
                                "per failure, and a picture (SVG: step over wall time, failures, recoveries)", parents)
    report.add_arguments(s)

    s = _command(sub, "history", "what each job used, as sacct shows it: start, end, elapsed, state, attempts, "
                                 "GPU-hours, peak memory", parents)
    history.add_arguments(s)

    s = _command(sub, "incidents", "one record per failed attempt: what broke, the GPUs' XIDs, kernel lines and "
                                   "readings before it, a hang's stacks, the recovery", parents)
    incidents.add_arguments(s)

    s = _command(sub, "logs", "a job's attempt logs (the latest attempt's unless told otherwise), read with your "
                 "own rights (docs/logs.md)", parents)
    s.add_argument("name", help="the job's name")
    s.add_argument("--attempt", type=int, metavar="N", help="attempt N's log only (with -f: until that attempt ends)")
    s.add_argument("--job-id", type=int, metavar="ID", help="an earlier job of a reused name (its id: `spx ls --all`)")
    s.add_argument("-f", "--follow", action="store_true",
                   help="follow the job through its restarts, a separator line per attempt, until it ends")
    s.add_argument("--tail", type=int, metavar="N", help="only the last N lines (after --rank and --since)")
    s.add_argument("--since", metavar="WHEN", help=(
        "only what was written since WHEN: a duration back (90s, 10m, 2h, 1d), a date-time (2026-12-04 21:00) "
        "or a time today (21:00); lines are dated by a timestamp at their start or above them, undated ones kept"))
    s.add_argument("--rank", type=int, metavar="R", help=(
        "only rank R's lines (torchrun's [default0]: prefix, PyTorch's [rank0]:), and spx's own notes"))

    s = _command(sub, "verify", "replay a job's checkpoint intervals on other GPUs and compare every step "
                 "(docs/verify.md)", parents)
    verify.add_arguments(s)

    s = _command(sub, "cancel", "stop a job (it gets its grace period to checkpoint)", parents)
    s.add_argument("name", help="the job's name")
    s.add_argument("--json", action="store_true", help=queue_cmds.JSON_HELP)

    s = _command(sub, "adopt", "root: queue the unfinished jobs another (lost) host left under DIR "
                               "(CHECKPOINT_DIR/.spx/job.yaml); each resumes from its latest checkpoint", parents)
    s.add_argument("dir", type=Path, help="the volume (or a directory on it) to look under")
    s.add_argument("--json", action="store_true", help=JSON_HELP)

    s = _command(sub, "doctor", "check this host against what training needs", parents)
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s.add_argument("--gpu-backend", choices=["auto", "nvml", "fake", "none"], help="as for spx-trainer")

    s = _command(sub, "gpus", "the daemon's GPUs: the job on each, its health and quarantine", parents)
    s.add_argument("--json", action="store_true", help=JSON_HELP)

    s = _command(sub, "gpu", "root/admin: release a quarantined GPU (`spx gpu release N`)", parents)
    s.add_argument("action", choices=["release"], help="release: put the GPU back in use")
    s.add_argument("index", type=int, help="the GPU's index (as `spx gpus` shows it)")
    s.add_argument("--json", action="store_true", help=queue_cmds.JSON_HELP)

    queue_cmds.add_parsers(sub, parents)

    s = _command(sub, "top", "live view of jobs and GPUs", parents)
    s.add_argument("--once", action="store_true", help="print one frame and exit")
    s.add_argument("--json", action="store_true", help="print one snapshot {jobs, gpus, drained} as JSON and exit")

    s = _command(sub, "schema", "the job file's JSON Schema (for editors: completion and checks as you type)",
                 parents)
    s.add_argument("--output", "-o", type=Path, metavar="FILE", help="write it to FILE (default: stdout)")
    return p
