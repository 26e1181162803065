"""The generated completion, run by a real bash the way bash-completion calls it (COMP_WORDS,
COMP_CWORD, then the function `complete -F` names): what a user gets on TAB."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest

from spx.daemon.cli import completion, parser_tree

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")


def _complete(tmp_path, program: str, line: str) -> list[str]:
    """COMPREPLY for the command line `line` (the cursor at its end; a trailing space starts a new word)."""
    script = tmp_path / f"{program}.bash"
    script.write_text(completion.bash(parser_tree.program(program)))
    words = line.split() + ([""] if line.endswith(" ") else [])
    fn = completion._function(program)
    probe = (f"source {shlex.quote(str(script))}; cd {shlex.quote(str(tmp_path))}; "
             f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); COMP_CWORD={len(words) - 1}; "
             f"{fn}; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    out = subprocess.run(["bash", "--norc", "--noprofile", "-c", probe], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    return sorted(w for w in out.splitlines() if w)


def test_subcommands_options_and_choices(tmp_path):
    assert {"submit", "ls", "status", "logs", "doctor"} <= set(_complete(tmp_path, "spx", "spx "))
    assert _complete(tmp_path, "spx", "spx st") == ["status"]
    assert "--follow" in _complete(tmp_path, "spx", "spx logs --")
    assert _complete(tmp_path, "spx", "spx doctor --gpu-backend f") == ["fake"]
    assert _complete(tmp_path, "spx", "spx --ver") == ["--version"]
    assert _complete(tmp_path, "spx-trainer", "spx-trainer --log-level w") == ["warning"]


def test_an_option_value_is_skipped_and_paths_complete_as_files(tmp_path):
    (tmp_path / "job.yaml").write_text("name: x\n")
    # `--root DIR` takes its value: the word after it is still the subcommand position
    assert "ls" in _complete(tmp_path, "spx", "spx --root /srv/x ")
    assert _complete(tmp_path, "spx", "spx submit jo") == ["job.yaml"]
    assert _complete(tmp_path, "spx-trainer", "spx-trainer --config jo") == ["job.yaml"]


def test_after_the_double_dash_submit_completes_a_command(tmp_path):
    assert "bash" in _complete(tmp_path, "spx", "spx submit --gpus 1 -- bas")
