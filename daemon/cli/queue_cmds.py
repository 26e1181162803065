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
from collections.abc import Callable

COMMANDS = ("hold", "release", "priority", "drain", "undrain")
Ask = Callable[..., object]


def add_parsers(sub: argparse._SubParsersAction) -> None:
    for cmd, text in (("hold", "keep a queued job from starting (until spx release)"),
                      ("release", "let a held job start")):
        s = sub.add_parser(cmd, help=text)
        s.add_argument("name")
    s = sub.add_parser("priority", help="root/admin: set a job's priority (higher starts first)")
    s.add_argument("name")
    s.add_argument("value", type=int, help="-1000..1000")
    sub.add_parser("drain", help="root/admin: start no new jobs (running ones go on); kept across daemon restarts")
    sub.add_parser("undrain", help="root/admin: end a drain")


def run(args: argparse.Namespace, ask: Ask) -> int:
    """Send the request; print the daemon's answer (errors raise through `ask`)."""
    if args.command in ("drain", "undrain"):
        print(ask(args.command, None))
    elif args.command == "priority":
        print(ask("priority", args.name, arg=str(args.value)))
    else:
        print(ask(args.command, args.name))
    return 0
