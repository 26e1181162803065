"""The argparse parsers of `spx` and `spx-trainer` as plain data: commands, their options and
positionals, with help text. The man pages (manpage.py) and the shell completion (completion.py) are
generated from this at install time, so neither can drift from the code: a new option is in both the
moment it is in the parser.

argparse keeps subcommands in a private action (`_SubParsersAction`, with `_choices_actions` for
their help); this module is the one place that reads those internals.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Arg:
    """An option (`flags` set) or a positional (`flags` empty). `metavar` is None for a flag that
    takes no value; `paths` when the value is a file or directory."""

    flags: tuple[str, ...]
    metavar: str | None
    choices: tuple[str, ...]
    help: str
    paths: bool


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]  # ("spx", "gpu")
    summary: str           # the help its parent lists it with
    description: str
    usage: str
    epilog: str
    options: tuple[Arg, ...]
    positionals: tuple[Arg, ...]
    subcommands: tuple[Command, ...]

    @property
    def name(self) -> str:
        return " ".join(self.path)


def _parsers() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    from spx.daemon.cli.main import build_parser as spx_parser
    from spx.daemon.service.main import build_parser as daemon_parser

    return {"spx": spx_parser, "spx-trainer": daemon_parser}


PROGRAMS = ("spx", "spx-trainer")


def program(name: str) -> Command:
    """The command tree of `spx` or `spx-trainer`."""
    return walk(_parsers()[name](), (name,))


def _arg(action: argparse.Action) -> Arg:
    takes_value = action.nargs != 0
    metavar = action.metavar if isinstance(action.metavar, str) else None
    if takes_value and metavar is None:
        metavar = action.dest.upper() if action.option_strings else action.dest
    choices = tuple(str(c) for c in action.choices) if action.choices is not None else ()
    paths = action.type is Path or action.dest in ("file", "dir") or (metavar or "") in ("FILE", "DIR")
    return Arg(tuple(action.option_strings), metavar if takes_value else None, choices,
               "" if action.help in (None, argparse.SUPPRESS) else str(action.help), paths)


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(prog=parser.prog, width=78)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    return formatter.format_help().strip()


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...], summary: str = "") -> Command:
    options: list[Arg] = []
    positionals: list[Arg] = []
    subcommands: list[Command] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: str(a.help or "") for a in action._choices_actions}
            subcommands += [walk(sub, (*path, name), helps.get(name, "")) for name, sub in action.choices.items()]
        elif action.help != argparse.SUPPRESS:
            (options if action.option_strings else positionals).append(_arg(action))
    return Command(path, summary, parser.description or "", _usage(parser), parser.epilog or "",
                   tuple(options), tuple(positionals), tuple(subcommands))


def commands(top: Command) -> Iterator[Command]:
    """The command and every subcommand under it, depth first."""
    yield top
    for sub in top.subcommands:
        yield from commands(sub)
