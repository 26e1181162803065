"""Bash completion for `spx` and `spx-trainer`, generated from their argparse parsers (parser_tree).

    python -m spx.daemon.cli.completion spx > /usr/local/share/bash-completion/completions/spx

systemd/install.sh runs this at install time; nothing is written by hand, so a new subcommand or
option completes as soon as it is in the parser. A small script of ours rather than a dependency:
the parsers are plain argparse, and the output is a few `case` tables and one function.

It completes subcommand names, the options of the command typed so far, an option's choices
(`--gpu-backend f` → `fake`), files where an option or positional takes a path, and after
`spx submit … --` the command line to launch (commands, then files).
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys

from spx.daemon.cli.parser_tree import PROGRAMS, Arg, Command, commands, program

FILES = "@files"  # what __values prints for an option whose value is a path


def _function(prog: str) -> str:
    return "_" + re.sub(r"[^A-Za-z0-9_]", "_", prog)


def _case(fn: str, cases: list[tuple[str, str]], default: str = "") -> list[str]:
    """A bash function of one `case` on "$1|$2" (or "$1"): pattern → body."""
    lines = [f"{fn}() {{", '    case "$1|$2" in']
    lines += [f"        {shlex.quote(pattern)}) {body} ;;" for pattern, body in cases]
    lines += ["    esac", *([f"    {default}"] if default else []), "}"]
    return lines


def _echo(words: list[str]) -> str:
    return "echo " + shlex.quote(" ".join(words))


def _value_words(arg: Arg) -> str | None:
    if arg.choices:
        return _echo(list(arg.choices))
    if arg.paths:
        return _echo([FILES])
    return None


def bash(top: Command) -> str:
    """The completion script for one program (`complete -F _spx spx`)."""
    fn = _function(top.path[0])
    every = list(commands(top))
    options = [(f"{c.name}|", _echo([f for o in c.options for f in o.flags])) for c in every]
    takes = [(f"{c.name}|{f}", "return 0") for c in every for o in c.options if o.metavar for f in o.flags]
    values = [(f"{c.name}|{f}", v) for c in every for o in c.options if (v := _value_words(o)) for f in o.flags]
    words = [(f"{c.name}|", _echo([s.path[-1] for s in c.subcommands] + [x for p in c.positionals for x in p.choices]))
             for c in every]
    files = [(f"{c.name}|", "return 0") for c in every if any(p.paths for p in c.positionals)]
    children = [(f"{c.name}|{s.path[-1]}", "return 0") for c in every for s in c.subcommands]
    # `spx submit … -- COMMAND`: the command line is split off before argparse (submit_cmdline), so no
    # parser shows it.
    launch = top.path[0] == "spx"
    lines = [
        f"# bash completion for {top.path[0]}: generated from its argparse parser by",
        "# `python -m spx.daemon.cli.completion` at install time; regenerate, do not edit.",
        *_case(f"{fn}_options", options),
        *_case(f"{fn}_takes_value", takes, "return 1"),
        *_case(f"{fn}_values", values),
        *_case(f"{fn}_words", words),
        *_case(f"{fn}_files", files, "return 1"),
        *_case(f"{fn}_child", children, "return 1"),
        f"{fn}() {{",
        '    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}',
        f'    local cmd={shlex.quote(top.path[0])} i w',
        "    COMPREPLY=()",
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        "        w=${COMP_WORDS[i]}",
    ]
    if launch:
        lines += [  # spx submit … -- COMMAND: a command, then its files
            '        if [[ $w == -- ]]; then',
            '            if ((i + 1 == COMP_CWORD)); then COMPREPLY=($(compgen -c -- "$cur"))',
            '            else compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur")); fi',
            "            return 0",
            "        fi",
        ]
    lines += [
        f'        if {fn}_takes_value "$cmd" "$w"; then ((i++)); continue; fi',
        f'        if {fn}_child "$cmd" "$w"; then cmd="$cmd $w"; fi',
        "    done",
        f'    if [[ $prev == -* ]] && {fn}_takes_value "$cmd" "$prev"; then',
        f'        local values; values=$({fn}_values "$cmd" "$prev")',
        f'        if [[ $values == {FILES} ]]; then compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur"))',
        '        elif [[ -n $values ]]; then COMPREPLY=($(compgen -W "$values" -- "$cur")); fi',
        "        return 0",
        "    fi",
        f'    if [[ $cur == -* ]]; then COMPREPLY=($(compgen -W "$({fn}_options "$cmd")" -- "$cur")); return 0; fi',
        f'    COMPREPLY=($(compgen -W "$({fn}_words "$cmd")" -- "$cur"))',
        f'    if {fn}_files "$cmd"; then compopt -o filenames 2>/dev/null; COMPREPLY+=($(compgen -f -- "$cur")); fi',
        "    return 0",
        "}",
        f"complete -F {fn} {top.path[0]}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spx.daemon.cli.completion", description=__doc__.split("\n\n")[0])
    p.add_argument("program", choices=PROGRAMS)
    sys.stdout.write(bash(program(p.parse_args(argv).program)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
