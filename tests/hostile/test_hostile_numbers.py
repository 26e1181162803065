"""Hostile probes against the numbers root reads from a job's own files (issue 25): a heartbeat whose
step is 10**400 and whose phases are 1e400, and one whose step is 2**63 (past SQLite's integers).
Real users, the daemon as root, the real `spx` (see probe.py for what every probe asserts): every
user's `spx ls`, `spx status`, `spx top` and /metrics keep answering, the attacker's job shows
"heartbeat unreadable" and ends with a reason, its store record ends consistent across a restart of
the daemon, and nothing outside the user's reach changes."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest
from hostile.probe import (
    Bait,
    answering,
    drop_as,
    ended_with_reason,
    job_yaml,
    metrics_as,
    real_spx_as,
    start_daemon,
    user_script,
)

from harness import wait_for
from spx.daemon.state.store import Store

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: runs the daemon as root and creates users")

HUGE = "1" + "0" * 400  # a valid JSON integer: Python builds it, float() and SQLite refuse it


def _beat_then_wait(user: pwd.struct_passwd, name: str, beat: str, flag: Path, code: int) -> Path:
    """A job script that writes `beat` (JSON text, `NOW` replaced by the time) as its heartbeat, then
    waits for `flag` and exits with `code`."""
    return user_script(user, name, f"""
        import os, sys, time
        hb = os.environ["SPX_HEARTBEAT_FILE"]
        with open(hb + ".tmp", "w") as f:
            f.write({beat!r}.replace("NOW", repr(time.time())))
        os.rename(hb + ".tmp", hb)
        while not os.path.exists({str(flag)!r}):
            time.sleep(0.1)
        sys.exit({code})
    """)


def test_a_heartbeat_of_10_to_the_400_never_stops_anyone_reading(users, base):
    owner, victim, _group = users
    bait = Bait.plant(base)
    flags = [Path(u.pw_dir) / "spx-numbers-go" for u in (owner, victim)]
    for flag in flags:
        flag.unlink(missing_ok=True)
    huge = _beat_then_wait(owner, "huge.py", f'{{"step": {HUGE}, "time": NOW, "phases": {{"first_step": 1e400, '
                                             f'"rendezvous": {HUGE}}}, "epoch": {HUGE}}}', flags[0], 0)
    fine = _beat_then_wait(victim, "fine.py", '{"step": 7, "time": NOW}', flags[1], 0)
    d = start_daemon(base)
    try:
        drop_as(d, owner, "huge.yaml", job_yaml("huge", huge))
        drop_as(d, victim, "fine.yaml", job_yaml("fine", fine))
        d.wait_state("huge", "running", 60)
        d.wait_state("fine", "running", 60)
        shown = wait_for(lambda: (s := d.status("huge")).get("heartbeat_problem") and s, 30, "the unreadable beat")
        assert shown["state"] == "running" and shown["step"] is None
        assert shown["heartbeat_problem"].startswith("step 1000"), shown["heartbeat_problem"]
        assert "heartbeat unreadable: step 1000" in d.spx("status", "huge").stdout
        wait_for(lambda: (j := d.job("fine")) and j["step"] == 7, 30, "the other user's beat")
        for _ in range(3):  # (b) for every user: the reads that failed for good before
            # Every view is built (each heartbeat read) before `ls` keeps the caller's own jobs.
            mine = {j["name"]: j for j in json.loads(real_spx_as(victim, d, "ls", "--json", check=True).stdout)}
            assert mine["fine"]["step"] == 7 and ("huge" not in mine or mine["huge"]["step"] is None)
            assert json.loads(real_spx_as(victim, d, "status", "fine", "--json", check=True).stdout)["step"] == 7
            assert "fine" in real_spx_as(victim, d, "top", "--once", check=True).stdout
            text = metrics_as(victim, d)
            assert 'spx_job_step{spx_job="fine"} 7.0' in text and 'spx_job_state{spx_job="huge",state="running"} 1.0' in text
            assert 'spx_job_step{spx_job="huge"}' not in text
        assert not d.events("control_answer_failed") and not d.events("job_fault_contained")
        for name in ("huge", "fine"):
            d.spx("cancel", name)
            ended_with_reason(d, name, {"cancelled"}, 30)  # (c)
        bait.untouched()  # (a)
        answering(d)
    finally:
        for flag in flags:
            flag.touch()
        d.stop()
        for flag in flags:
            flag.unlink(missing_ok=True)


def test_a_step_past_sqlites_integers_leaves_the_store_consistent_across_a_restart(users, base):
    owner, _victim, _group = users
    bait = Bait.plant(base)
    flag = Path(owner.pw_dir) / "spx-numbers-exit"
    flag.unlink(missing_ok=True)
    script = _beat_then_wait(owner, "int64.py", f'{{"step": {2**63}, "time": NOW, "last_checkpoint_step": {2**63}}}',
                             flag, 1)
    d = start_daemon(base)
    try:
        drop_as(d, owner, "int64.yaml", job_yaml("int64", script).replace("max_restarts: 3", "max_restarts: 0"))
        d.wait_state("int64", "running", 60)
        shown = wait_for(lambda: (s := d.status("int64")).get("heartbeat_problem") and s, 30, "the unreadable beat")
        assert "9223372036854775808" in shown["heartbeat_problem"]
        flag.touch()  # the attempt ends: its end record is written with the step it reached
        job = ended_with_reason(d, "int64", {"failed"}, 60)  # (c)
        assert "exit code 1" in job["reason"], job
        d.stop()
        store = Store(d.root / "state" / "spx.sqlite", readonly=True)
        try:
            (row,) = [j for j in store.jobs.all() if j.name == "int64"]
            attempts = store.attempts.for_job(row.id)
            assert row.state.value == "failed" and row.gpus == [] and len(attempts) == 1
            assert attempts[0].end is not None and attempts[0].max_step is None
        finally:
            store.close()
        d.start()  # the restarted daemon finds nothing to adopt and nothing running
        assert d.status("int64")["state"] == "failed" and d.status("int64")["attempts"] == 1
        assert not d.events("job_fault_contained") and not d.events("store_write_failed")
        bait.untouched()  # (a)
        answering(d)  # (b)
    finally:
        flag.touch()
        d.stop()
        flag.unlink(missing_ok=True)
