"""The README's "Try it in 2 minutes" section, run as written: every command in its code blocks, from a
scratch copy of the checkout, as a new user types them after `make demo`.

Terminal 1's block is the daemon in the foreground; here it runs in the background, with one change:
its metrics listen on a free port (`--metrics-address 127.0.0.1:0`), so a test run never collides
with a daemon on 9101. Terminal 2's block runs as one bash session (so `. .venv/bin/activate` and
`export` carry over, as in a terminal), one command after the other, each of which must exit 0; the
job must then end `succeeded` after its injected crash and one resume. Everything started is stopped.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness import wait_for

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent
MARK = "#spx-readme-try"
JOB = "ddp-crash-resume"


def try_section_blocks() -> list[list[str]]:
    """The command lines of each ```sh block of the README's try section (comments dropped)."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Try it in 2 minutes", 1)[1].split("\n## ", 1)[0]
    blocks = [chunk.split("```", 1)[0] for chunk in section.split("```sh\n")[1:]]
    return [[line.split("  #", 1)[0].strip() for line in block.splitlines()
             if line.strip() and not line.lstrip().startswith("#")] for block in blocks]


def a_fresh_checkout(tmp_path: Path) -> Path:
    """examples/ as in the repo and .venv as `make demo` leaves it (this run's venv)."""
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "examples", checkout / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    (checkout / ".venv").symlink_to(VENV)
    return checkout


def session_script(lines: list[str]) -> str:
    """One bash session running `lines` in order; after each, a marker line with its index and exit
    status; the session stops at the first command that fails."""
    steps = [f'{line}\nrc=$?; printf "\\n{MARK} {i} %d\\n" "$rc"; [ "$rc" -eq 0 ] || exit "$rc"'
             for i, line in enumerate(lines)]
    return "\n".join(steps) + "\n"


def outputs_by_command(out: str, count: int) -> list[tuple[int, str]]:
    """[(exit status, output)] per command, read from the session's markers."""
    found, rest = [], out
    for i in range(count):
        head, sep, tail = rest.partition(f"\n{MARK} {i} ")
        if not sep:
            break
        status, _, rest = tail.partition("\n")
        found.append((int(status), head))
    return found


def stop(proc: subprocess.Popen, sig: int, timeout: float) -> None:
    """Signal `proc`'s whole session, wait, then SIGKILL it if it is still there."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            proc.wait()


@pytest.mark.slow
def test_the_readme_try_section_runs_as_written(tmp_path):
    blocks = try_section_blocks()
    assert len(blocks) == 2, blocks
    [[daemon_line], terminal2] = blocks
    assert shlex.split(daemon_line)[0] == ".venv/bin/spx-trainer" and "fake" in daemon_line, daemon_line
    checkout = a_fresh_checkout(tmp_path)
    # A new user's terminal: no spx on PATH until they activate the venv, no SPX_ROOT of ours.
    env = {k: v for k, v in os.environ.items() if k not in ("SPX_ROOT", "VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

    daemon_log = (tmp_path / "daemon.log").open("w")
    daemon = subprocess.Popen([*shlex.split(daemon_line), "--metrics-address", "127.0.0.1:0"], cwd=checkout,
                              env=env, stdout=daemon_log, stderr=subprocess.STDOUT, start_new_session=True)
    session = None
    try:
        wait_for(lambda: (checkout / "spx-root" / "run" / "spx.sock").exists(), 60, "the daemon's socket")
        session = subprocess.Popen(["bash", "--noprofile", "--norc", "-c", session_script(terminal2)], cwd=checkout,
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        out, _ = session.communicate(timeout=420)
        ran = outputs_by_command(out, len(terminal2))
        assert len(ran) == len(terminal2) and all(status == 0 for status, _ in ran), (terminal2, out)
        said = {line.split()[1] if line.startswith("spx ") else line: text
                for line, (_, text) in zip(terminal2, ran, strict=True)}
        assert said["submit"].strip().startswith(f"{JOB}: "), said["submit"]
        assert JOB in said["ls"], said["ls"]
        assert "[default0]" in said["logs"] and "step" in said["logs"], said["logs"]
        assert "InjectedCrash: injected crash at step 25" in said["status"], said["status"]  # attempt 1's root cause
        assert "8 GPUs" in said["top"], said["top"]

        def job() -> dict:
            res = subprocess.run([str(VENV / "bin" / "spx"), "--root", str(checkout / "spx-root"), "status", JOB,
                                  "--json"], env=env, capture_output=True, text=True, timeout=60)
            return json.loads(res.stdout) if res.stdout.strip() else {}

        wait_for(lambda: job().get("state") in ("succeeded", "failed", "cancelled"), 300, "the job's end")
        final = job()
        assert (final["state"], final["attempts"]) == ("succeeded", 2), final
        assert final["history"][-1]["resumed_from_step"] == 20, final["history"]
    finally:
        if session is not None:
            stop(session, signal.SIGKILL, 10)
        stop(daemon, signal.SIGTERM, 120)
        daemon_log.close()
    assert daemon.returncode == 0, (tmp_path / "daemon.log").read_text()[-3000:]
