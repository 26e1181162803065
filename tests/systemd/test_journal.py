"""The daemon's lines in the journal of a real systemd (booted in namespaces, see conftest.py), as an
operator filters them (issue 26): a failed job's error line is what `journalctl -u spx-trainer -p err`
shows, and `journalctl SPX_JOB=NAME` finds that job's lines and no other's, each an entry of its own
(the native protocol, core/journal.py) with the job's attempt, its level as PRIORITY and the JSON line."""

from __future__ import annotations

import json

import pytest
from conftest import JOB_USER, UNIT

from harness import wait_for

pytestmark = pytest.mark.systemd

SPX = "/opt/spx-trainer/venv/bin/spx"
CRASH = 'raise ValueError("learning rate must be positive")\n'


def journal(sb, *args: str) -> list[dict]:
    out = sb.run("journalctl", "--no-pager", "-o", "json", *args, check=False).stdout
    return [json.loads(line) for line in out.splitlines()]


def submit_failing(sb, name: str) -> None:
    """A job of the unprivileged user that fails at its first attempt (no relaunch allowed)."""
    sb.run("sh", "-c", "cat > ~/crash.py", user=JOB_USER, input=CRASH)
    spec = (f"name: {name}\nlauncher: python\nscript: /home/{JOB_USER}/crash.py\n"
            f"python: /opt/spx-trainer/venv/bin/python\nrestart: {{max_restarts: 0}}\n")
    sb.run("sh", "-c", f"cat > ~/{name}.yaml", user=JOB_USER, input=spec)
    sb.run(SPX, "submit", f"/home/{JOB_USER}/{name}.yaml", user=JOB_USER)


def test_a_failed_jobs_error_is_in_journalctl_p_err_and_its_lines_under_spx_job(unit):
    sb = unit
    sb.systemctl("start", UNIT)
    submit_failing(sb, "jfail")
    wait_for(lambda: json.loads(sb.run(SPX, "status", "jfail", "--json", check=False).stdout)["state"] == "failed",
             120, "jfail to fail", interval=0.5)

    def errors() -> list[dict]:
        return [e for e in journal(sb, "-u", UNIT, "-p", "err") if e.get("SPX_JOB") == "jfail"]

    failed = wait_for(errors, 30, "jfail's error line in journalctl -p err")
    assert [e["SPX_EVENT"] for e in failed] == ["attempt_ended"], failed
    line = failed[0]
    assert (line["PRIORITY"], line["SPX_ATTEMPT"], line["_TRANSPORT"]) == ("3", "1", "journal"), line
    # readable as it is: the event, the job, the state it ended in and its root cause, on one line
    assert line["MESSAGE"].startswith("attempt_ended job=jfail attempt=1 "), line["MESSAGE"]
    assert "next_state=failed" in line["MESSAGE"] and "ValueError: learning rate must be positive" in line["MESSAGE"]
    doc = json.loads(line["SPX_JSON"])
    assert (doc["event"], doc["level"], doc["job"], doc["attempt"]) == ("attempt_ended", "error", "jfail", 1)
    # the daemon's own lines as the unit's, at its pid: `-u` still finds them
    assert line["_SYSTEMD_UNIT"] == UNIT and line["_PID"] == sb.show(UNIT, "MainPID")["MainPID"]

    # `journalctl SPX_JOB=NAME`: this job's lines, info and error alike, and only them
    lines = journal(sb, "SPX_JOB=jfail")
    events = [e["SPX_EVENT"] for e in lines]
    # (the job's end is recorded off the loop, so `job_end_recorded` may follow `attempt_ended`)
    assert "attempt_started" in events and "attempt_ended" in events, events
    assert all(e["SPX_JOB"] == "jfail" and json.loads(e["SPX_JSON"])["job"] == "jfail" for e in lines)
    started = next(e for e in lines if e["SPX_EVENT"] == "attempt_started")
    assert (started["PRIORITY"], started["SPX_ATTEMPT"]) == ("6", "1"), started
    # the JSON lines whole, as docs/logs.md shows them to jq
    cat = sb.run("journalctl", "--no-pager", "-o", "cat", "--output-fields=SPX_JSON", "SPX_JOB=jfail").stdout
    assert [json.loads(x)["event"] for x in cat.splitlines()] == events, cat
    # the daemon-wide lines carry no job and are not at error: `-p err` stays the operator's list of failures
    ready = [e for e in journal(sb, "-u", UNIT) if e.get("SPX_EVENT") == "daemon_ready"]
    assert ready and all("SPX_JOB" not in e and e["PRIORITY"] == "6" for e in ready), ready
