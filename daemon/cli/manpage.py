"""The man pages `spx(1)` and `spx-trainer(8)`, generated from the argparse parsers (parser_tree).

    python -m spx.daemon.cli.manpage spx > /usr/local/share/man/man1/spx.1

systemd/install.sh runs this at install time, so the page lists exactly the commands and options the
installed code has. Plain roff (the man(7) macros), written by a few lines of ours rather than a
dependency; each command's text is its parser's: description, usage, every option with its help,
each subcommand with its own, and the epilog (exit statuses, environment) where a parser has one.
"""

from __future__ import annotations

import argparse
import sys
import time

from spx.daemon.cli.parser_tree import PROGRAMS, Arg, Command, commands, program

# man section and the one line NAME gives, per program
SECTIONS = {"spx": ("1", "submit and inspect spx-trainer training jobs"),
            "spx-trainer": ("8", "the daemon that supervises training jobs dropped into its spool")}
SEE_ALSO = {"spx": "spx-trainer(8), systemctl(1), journalctl(1)",
            "spx-trainer": "spx(1), systemd.service(5), systemctl(1)"}


def escape(text: str) -> str:
    """Text as roff reads it literally: backslashes and hyphens escaped, no line starting a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    text = "".join(c if c.isascii() else f"\\[u{ord(c):04X}]" for c in text)  # groff without preconv
    return "\n".join("\\&" + line if line.startswith((".", "'")) else line for line in text.splitlines())


def _arg(arg: Arg) -> list[str]:
    shown = ", ".join(f"\\fB{escape(f)}\\fR" for f in arg.flags) or f"\\fI{escape(arg.metavar or '')}\\fR"
    if arg.flags and arg.metavar:
        shown += f" \\fI{escape(arg.metavar)}\\fR"
    text = arg.help
    if arg.choices:
        text += ("; " if text else "") + "one of: " + ", ".join(arg.choices)
    return [".TP", shown, escape(text) if text else "\\&"]


def _command(c: Command, heading: str) -> list[str]:
    usage = "\n".join(line.strip() for line in c.usage.splitlines())
    lines = [heading, ".nf", escape(usage), ".fi"]
    if c.summary or c.description:
        lines += [".PP", escape(c.description if c.description and not c.summary else c.summary)]
    lines += [line for a in (*c.positionals, *c.options) for line in _arg(a)]
    if c.epilog and len(c.path) > 1:
        lines += [".PP", escape(c.epilog)]
    return lines


def roff(top: Command, version: str, date: str) -> str:
    name = top.path[0]
    section, what = SECTIONS[name]
    lines = [f'.TH "{name.upper()}" "{section}" "{date}" "spx-trainer {version}" "spx-trainer"',
             ".SH NAME", f"{escape(name)} \\- {escape(what)}",
             ".SH SYNOPSIS", ".nf", escape(top.usage), ".fi",
             ".SH DESCRIPTION", escape(top.description)]
    lines += [".SH OPTIONS", *[line for a in (*top.positionals, *top.options) for line in _arg(a)]]
    subs = list(commands(top))[1:]
    if subs:
        lines.append(".SH COMMANDS")
        for c in subs:
            lines += _command(c, f'.SS "{escape(c.name)}"')
    if top.epilog:
        lines += [".SH NOTES", escape(top.epilog)]
    lines += [".SH SEE ALSO", escape(SEE_ALSO[name]) + "; /opt/spx\\-trainer/src/docs/ (the installed documentation)"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from spx.daemon.core.version import daemon_version

    p = argparse.ArgumentParser(prog="python -m spx.daemon.cli.manpage", description=__doc__.split("\n\n")[0])
    p.add_argument("program", choices=PROGRAMS)
    args = p.parse_args(argv)
    sys.stdout.write(roff(program(args.program), daemon_version(), time.strftime("%Y-%m-%d")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
