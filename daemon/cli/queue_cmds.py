"""`spx hold|release NAME`, `spx priority NAME N`, `spx drain|undrain`: the queue's controls.

    spx hold NAME          # a queued job does not start until released (owner, root or admin group)
    spx release NAME
    spx priority NAME N    # root/admin: -1000..1000, higher starts first (FIFO within a priority)
    spx drain              # root/admin: no new job starts; running jobs go on, relaunches included
    spx undrain

Each is a change request over the control socket, decided by the daemon's main loop with the
caller's uid from the kernel (service/queue_control.py); with no daemon running they fail.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

COMMANDS = ("hold", "release", "priority", "drain", "undrain")
Ask = Callable[..., object]


JSON_HELP = "print the daemon's answer as JSON: {command, job or gpu, message}"


def add_parsers(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    for cmd, text in (("hold", "keep a queued job from starting (until spx release)"),
                      ("release", "let a held job start")):
        s = sub.add_parser(cmd, help=text, description=text, parents=parents)
        s.add_argument("name", help="the job's name")
        s.add_argument("--json", action="store_true", help=JSON_HELP)
    text = "root/admin: set a job's priority (higher starts first)"
    s = sub.add_parser("priority", help=text, description=text, parents=parents)
    s.add_argument("name", help="the job's name")
    s.add_argument("value", type=int, help="-1000..1000")
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    for cmd, text in (("drain", "root/admin: start no new jobs (running ones go on); kept across daemon restarts"),
                      ("undrain", "root/admin: end a drain")):
        s = sub.add_parser(cmd, help=text, description=text, parents=parents)
        s.add_argument("--json", action="store_true", help=JSON_HELP)


def run(args: argparse.Namespace, ask: Ask) -> int:
    """Send the request; print the daemon's answer (errors raise through `ask`)."""
    if args.command in ("drain", "undrain"):
        print_change(args, ask(args.command, None))
    elif args.command == "priority":
        print_change(args, ask("priority", args.name, arg=str(args.value)), job=args.name, priority=args.value)
    else:
        print_change(args, ask(args.command, args.name), job=args.name)
    return 0


def print_change(args: argparse.Namespace, message: object, **target: object) -> None:
    """A change's answer: the daemon's sentence, or with `--json` one object naming the command,
    what it acted on and that sentence (failures never get here: they exit non-zero, on stderr)."""
    command = "gpu release" if args.command == "gpu" else args.command
    if getattr(args, "json", False):
        print(json.dumps({"command": command, **target, "message": message}, indent=1))
    else:
        print(message)
