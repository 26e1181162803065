"""The man pages and the bash completion come from the live parsers (cli/parser_tree), so a command or
option added to `spx` or `spx-trainer` is in both without anyone editing them. Pure generation: the
bash that runs the completion is tests/integration/test_completion_bash.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from spx.daemon.cli import completion, manpage, parser_tree
from spx.daemon.cli.main import build_parser as spx_parser
from spx.daemon.service.main import build_parser as daemon_parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(subs[0].choices) if subs else {}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {f for a in parser._actions if a.help != argparse.SUPPRESS for f in a.option_strings}


def test_every_spx_command_and_option_is_in_the_completion_and_the_man_page():
    live = spx_parser()
    script = completion.bash(parser_tree.program("spx"))
    page = manpage.roff(parser_tree.program("spx"), "9.9", "2026-01-01")
    assert _subcommands(live), "spx has subcommands"
    for name, sub in _subcommands(live).items():
        assert f"'spx {name}|')" in script, name
        assert f'.SS "spx {name}"' in page, name
        flags = _flags(sub)
        completed = next(line for line in script.splitlines() if line.strip().startswith(f"'spx {name}|')"))
        assert flags <= set(completed.split("echo ", 1)[1].strip("' ;").split()), name
        for flag in flags:
            assert f"\\fB{manpage.escape(flag)}\\fR" in page, (name, flag)


def test_the_daemon_flags_are_in_its_completion_and_man_page():
    script = completion.bash(parser_tree.program("spx-trainer"))
    page = manpage.roff(parser_tree.program("spx-trainer"), "9.9", "2026-01-01")
    flags = _flags(daemon_parser())
    assert {"--version", "--config", "--root", "--gpu-backend", "--check"} <= flags
    for flag in flags:
        assert flag in script and f"\\fB{manpage.escape(flag)}\\fR" in page
    assert page.startswith('.TH "SPX-TRAINER" "8" "2026-01-01" "spx-trainer 9.9"')
    assert "complete -F _spx_trainer spx-trainer" in script


def test_a_new_option_and_subcommand_are_picked_up_from_the_parser():
    """What parser_tree reads from any parser: choices, paths, flags without a value, subcommands."""
    p = argparse.ArgumentParser(prog="spx")
    sub = p.add_subparsers(dest="command")
    s = sub.add_parser("frobnicate", help="turn the knob")
    s.add_argument("--speed", choices=["slow", "fast"], help="how fast")
    s.add_argument("--out", type=Path, help="where to")
    s.add_argument("--dry", action="store_true")
    s.add_argument("target")
    tree = parser_tree.walk(p, ("spx",))
    (frob,) = tree.subcommands
    assert frob.name == "spx frobnicate" and frob.summary == "turn the knob"
    by_flag = {a.flags[0]: a for a in frob.options}
    assert by_flag["--speed"].choices == ("slow", "fast") and by_flag["--speed"].metavar == "SPEED"
    assert by_flag["--out"].paths and not by_flag["--speed"].paths
    assert by_flag["--dry"].metavar is None
    assert [a.metavar for a in frob.positionals] == ["target"]
    script = completion.bash(tree)
    assert "'spx frobnicate|--speed') echo 'slow fast' ;;" in script
    assert f"'spx frobnicate|--out') echo {completion.FILES} ;;" in script
    assert "'spx frobnicate|--out') return 0 ;;" in script  # --out takes the next word
    assert "'spx frobnicate|--dry')" not in script.split("_spx_takes_value()")[1].split("}")[0]
    assert "'spx|frobnicate') return 0 ;;" in script
    page = manpage.roff(tree, "1.0", "2026-01-01")
    assert '.SS "spx frobnicate"' in page and "how fast; one of: slow, fast" in page


def test_version_is_an_option_of_both_programs():
    for name in parser_tree.PROGRAMS:
        flags = {f for a in parser_tree.program(name).options for f in a.flags}
        assert "--version" in flags, name


def test_roff_escapes_what_troff_would_read_as_requests():
    assert manpage.escape("--root") == "\\-\\-root"
    assert manpage.escape("a\\b") == "a\\eb"
    assert manpage.escape(".hidden\n'quoted") == "\\&.hidden\n\\&'quoted"
    assert manpage.escape("python …") == "python \\[u2026]"


def test_submit_completes_the_launch_command_after_the_double_dash():
    script = completion.bash(parser_tree.program("spx"))
    assert 'if [[ $w == -- ]]; then' in script and "compgen -c" in script
    assert "[[ $w == -- ]]" not in completion.bash(parser_tree.program("spx-trainer"))
