"""`spx`'s conventions, without a daemon: global options after the command, help text on every
option, the exit statuses in `--help` and docs/cli.md, colour (NO_COLOR, --color), the `ls` USER
column and filters, `--json` of the changes, a closed pipe, SIGTERM during `spx top`, and the
block-style YAML of `--dry-run`."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest
import yaml

from spx.daemon.cli import colour, filters, main, queue_cmds, render, top
from spx.daemon.cli.client import EXIT_CODES, EXIT_INTERRUPTED, EXIT_PIPE_CLOSED
from spx.daemon.cli.colour import Paint
from spx.daemon.cli.parser import build_parser
from spx.daemon.cli.submit_cmdline import render as render_job_file

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


# --- the parser -----------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["--root", "/r", "submit", "job.yaml"],
    ["submit", "job.yaml", "--root", "/r"],
    ["submit", "--root", "/r", "job.yaml"],
    ["--root", "/elsewhere", "ls", "--root", "/r"],  # the one after the command wins, as it is read last
])
def test_global_options_are_taken_before_or_after_the_command(argv):
    assert build_parser().parse_args(argv).root == Path("/r")


def test_global_options_not_given_after_the_command_keep_their_defaults():
    args = build_parser().parse_args(["--config", "/c.yaml", "--color", "never", "ls"])
    assert (args.root, args.config, args.color) == (None, Path("/c.yaml"), "never")
    assert build_parser().parse_args(["ls"]).color == "auto"


def test_every_option_and_argument_of_every_command_has_help_text():
    parser = build_parser()
    missing = []
    for name, sub in {"spx": parser, **subcommands(parser)}.items():
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            if not (action.help or "").strip():
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, missing


def test_every_command_that_prints_an_answer_has_json():
    without = {"logs", "schema"}  # a log is text as the job wrote it; a schema is JSON already
    subs = subcommands(build_parser())
    lacking = [n for n, s in subs.items() if n not in without and not any("--json" in a.option_strings for a in s._actions)]
    assert not lacking, lacking


def test_help_lists_every_exit_status_and_spx_root():
    text = build_parser().format_help()
    listed = re.findall(r"^  (\d+) +", text.split("exit status:", 1)[1], flags=re.M)
    assert [int(c) for c in listed] == [code for code, _ in EXIT_CODES]
    assert "SPX_ROOT" in text and "NO_COLOR" in text


def test_docs_cli_md_lists_the_same_exit_statuses():
    doc = (REPO / "docs" / "cli.md").read_text()
    table = doc.split("## Exit status", 1)[1].split("\n## ", 1)[0]
    assert [int(c) for c in re.findall(r"^\| (\d+) +\|", table, flags=re.M)] == [code for code, _ in EXIT_CODES]


def test_docs_cli_md_names_every_command():
    doc = (REPO / "docs" / "cli.md").read_text()
    assert [n for n in subcommands(build_parser()) if f"spx {n}" not in doc] == []


# --- colour ---------------------------------------------------------------------------------------


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("mode", "env", "stream", "on"), [
    ("auto", {}, Tty(), True),
    ("auto", {}, io.StringIO(), False),           # a pipe or a file
    ("auto", {"NO_COLOR": "1"}, Tty(), False),    # no-color.org
    ("auto", {"NO_COLOR": ""}, Tty(), True),      # set but empty: not a request
    ("auto", {"TERM": "dumb"}, Tty(), False),
    ("never", {}, Tty(), False),
    ("always", {"NO_COLOR": "1"}, io.StringIO(), True),  # asked for by name
])
def test_colour_is_wanted_on_a_terminal_unless_no_color(mode, env, stream, on):
    assert colour.wanted(mode, stream, env) is on


def test_painted_states_and_verdicts_and_plain_text_untouched():
    paint = Paint(True)
    assert paint.state("failed") == f"{colour.BOLD_RED}failed{colour.RESET}"
    assert paint.state("running   ", "running") == f"{colour.GREEN}running   {colour.RESET}"
    assert paint.check("✗", "fail") == f"{colour.BOLD_RED}✗{colour.RESET}"
    assert paint.state("no-such-state") == "no-such-state"
    assert Paint(False).state("failed") == "failed"


# --- spx ls: USER, filters ------------------------------------------------------------------------


def job(name: str, state: str, owner: str, uid: int) -> dict:
    return {"name": name, "job_id": 1, "state": state, "owner": owner, "owner_uid": uid, "attempts": 1, "step": 5,
            "last_checkpoint_step": None, "last_checkpoint_time": None, "gpus": [0], "reason": "because"}


JOBS = [job("a", "running", "alice", 1001), job("b", "failed", "bob", 1002), job("c", "queued", "alice", 1001)]


def test_ls_table_has_a_user_column_and_painting_keeps_the_columns_aligned(capsys):
    render.print_table(JOBS)
    plain = capsys.readouterr().out.splitlines()
    assert plain[0].split()[:4] == ["NAME", "JOB", "STATE", "USER"]
    assert [line.split()[3] for line in plain[1:]] == ["alice", "bob", "alice"]
    render.print_table(JOBS, Paint(True))
    painted = capsys.readouterr().out.splitlines()
    assert painted != plain and [ANSI.sub("", line) for line in painted] == plain


@pytest.mark.parametrize(("argv", "names"), [
    ([], ["a", "b", "c"]),
    (["--me"], ["a", "c"]),  # uid 1001 is "me" below
    (["--user", "bob"], ["b"]),
    (["--user", "1002,alice"], ["a", "b", "c"]),
    (["--state", "running,queued"], ["a", "c"]),
    (["--state", "failed", "--state", "queued", "--user", "alice"], ["c"]),
])
def test_ls_filters(argv, names):
    args = build_parser().parse_args(["ls", *argv])
    keep = filters.selects(args, uid=1001)
    assert [j["name"] for j in JOBS if keep(j)] == names


def test_an_unknown_state_is_a_usage_error_naming_the_states(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["ls", "--state", "runing"])
    assert e.value.code == 2
    assert "the states are queued" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "seconds"), [
    ("all", 0.0), ("90s", 1_000_000 - 90), ("30m", 1_000_000 - 1800), ("12h", 1_000_000 - 43200),
    ("7d", 1_000_000 - 7 * 86400), ("2w", 1_000_000 - 14 * 86400), ("1.5h", 1_000_000 - 5400),
])
def test_since_ages(text, seconds):
    assert filters.since_seconds(text, now=1_000_000.0) == seconds


def test_since_dates_are_local_time_and_nonsense_is_refused():
    from datetime import datetime

    assert filters.since_seconds("2024-05-01", 0) == datetime(2024, 5, 1).timestamp()
    assert filters.since_seconds("2024-05-01T09:30", 0) == datetime(2024, 5, 1, 9, 30).timestamp()
    with pytest.raises(argparse.ArgumentTypeError, match="an age"):
        filters.since_seconds("yesterday", 0)


# --- --json of the changes ------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "asked", "shown"), [
    (["hold", "j"], ("hold", "j", None), {"command": "hold", "job": "j"}),
    (["release", "j"], ("release", "j", None), {"command": "release", "job": "j"}),
    (["priority", "j", "7"], ("priority", "j", "7"), {"command": "priority", "job": "j", "priority": 7}),
    (["drain"], ("drain", None, None), {"command": "drain"}),
    (["undrain"], ("undrain", None, None), {"command": "undrain"}),
])
def test_queue_changes_print_the_answer_or_one_json_object(argv, asked, shown, capsys):
    calls = []

    def ask(op, name, arg=None):
        calls.append((op, name, arg))
        return "the daemon's sentence"

    assert queue_cmds.run(build_parser().parse_args(argv), ask) == 0
    assert capsys.readouterr().out == "the daemon's sentence\n"
    assert queue_cmds.run(build_parser().parse_args([*argv, "--json"]), ask) == 0
    assert json.loads(capsys.readouterr().out) == {**shown, "message": "the daemon's sentence"}
    assert calls == [asked, asked]


def test_cancel_and_gpu_release_json_name_what_they_acted_on(capsys):
    queue_cmds.print_change(build_parser().parse_args(["cancel", "j", "--json"]), "cancelling j", job="j")
    queue_cmds.print_change(build_parser().parse_args(["gpu", "release", "3", "--json"]), "released", gpu=3)
    first, second = capsys.readouterr().out.split("}\n", 1)
    assert json.loads(first + "}") == {"command": "cancel", "job": "j", "message": "cancelling j"}
    assert json.loads(second) == {"command": "gpu release", "gpu": 3, "message": "released"}


# --- ending: a closed pipe, Ctrl-C, SIGTERM in `spx top` ------------------------------------------


class ClosedPipe(io.TextIOBase):
    """stdout whose reader left (`spx … | head` after its lines): every write raises EPIPE."""

    def __init__(self, fd: int):
        self.fd = fd

    def write(self, _text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self) -> int:
        return self.fd


def test_a_closed_pipe_ends_quietly_with_141(monkeypatch, capsys):
    read_end, write_end = os.pipe()
    os.close(read_end)
    monkeypatch.setattr(sys, "stdout", ClosedPipe(write_end))
    try:
        assert main.main(["schema"]) == EXIT_PIPE_CLOSED
        os.write(write_end, b"x")  # now /dev/null under that fd: the flush at exit cannot fail
    finally:
        os.close(write_end)
    assert capsys.readouterr().err == ""  # no traceback


def test_ctrl_c_exits_130(monkeypatch):
    def interrupted(_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(main, "run", interrupted)
    assert main.main(["ls"]) == EXIT_INTERRUPTED


def test_sigterm_during_spx_top_gives_the_cursor_back_and_exits_143():
    out = Tty()
    before = signal.getsignal(signal.SIGTERM)

    def fetch():
        signal.raise_signal(signal.SIGTERM)  # as `kill PID` would, while a frame is fetched
        return [], [], None

    with pytest.raises(SystemExit) as e:
        top.run_top(fetch, out=out, sleep=lambda _s: None, max_frames=3)
    assert e.value.code == 128 + signal.SIGTERM
    assert out.getvalue().startswith(top.HIDE_CURSOR) and out.getvalue().endswith(top.SHOW_CURSOR)
    assert signal.getsignal(signal.SIGTERM) is before


def test_spx_top_json_is_one_snapshot(monkeypatch, capsys):
    answers = {"ls": [JOBS[0]], "gpus": [{"index": 0}], "queue": {"drained": "by root"}}
    monkeypatch.setattr(main, "ask", lambda _cfg, op, *_a: answers[op])
    assert main.cmd_top(None, build_parser().parse_args(["top", "--json"])) == 0
    assert json.loads(capsys.readouterr().out) == {"jobs": [JOBS[0]], "gpus": [{"index": 0}], "drained": "by root"}


# --- --dry-run's job file -------------------------------------------------------------------------


def test_dry_run_yaml_is_block_style_and_stays_valid_when_a_key_is_added():
    data = {"name": "train", "launcher": "python", "workdir": "/p", "script": "train.py", "gpus": 0}
    text = render_job_file(data, ["python", "train.py"], [], Path("/p"))
    body = [line for line in text.splitlines() if not line.startswith("#")]
    assert body == ["name: train", "launcher: python", "workdir: /p", "script: train.py", "gpus: 0"]
    assert yaml.safe_load(text + "checkpoints:\n  keep: 3\n") == {**data, "checkpoints": {"keep": 3}}


def test_submit_for_a_script_exits_3_when_no_daemon_takes_the_file(tmp_path, monkeypatch, capsys):
    """No daemon: the file stays in the spool (queued when one runs), but there is no job id to print."""
    from spx.daemon.cli import submit
    from spx.daemon.core.config import DaemonConfig

    cfg = DaemonConfig.rooted(tmp_path / "root")
    cfg.spool_dir.mkdir(parents=True)
    (tmp_path / "job.yaml").write_text("name: later\nlauncher: python\nscript: t.py\n")
    monkeypatch.setattr(submit, "ID_ANSWER_SECONDS", 0.0)  # no wait: nothing will answer
    monkeypatch.setattr(submit, "_say_what_resumes", lambda *_a: None)  # a helper process as the user
    args = build_parser().parse_args(["submit", "--parsable", str(tmp_path / "job.yaml")])
    args.launch_argv = None
    assert submit.cmd_submit(cfg, args) == 3
    out, err = capsys.readouterr()
    assert out == "" and "no job id yet" in err
    assert [p.name.startswith("later-") for p in cfg.spool_dir.iterdir()] == [True]


def test_doctor_verdicts_are_coloured_only_when_painting():
    from spx.daemon.doctor.check import Check
    from spx.daemon.doctor.report import render_text

    checks = [Check("py-spy", "fail", "not installed", "pip install py-spy"), Check("driver", "ok", "550"),
              Check("volume", "warn", "90 % full", "free space")]
    plain = render_text(checks)
    painted = render_text(checks, Paint(True).check)
    assert f"{colour.BOLD_RED}✗{colour.RESET} py-spy" in painted and f"{colour.YELLOW}!{colour.RESET} volume" in painted
    assert f"{colour.GREEN}✓{colour.RESET} driver" in painted
    assert ANSI.sub("", painted) == plain and "\x1b" not in plain
