"""1,000 jobs dropped at once: every one is recorded (none lost, none run), the daemon stays
responsive (`spx ls` answers while it takes them in), and all are cancelled."""

from __future__ import annotations

import time

import pytest
from ledger import CountedJob, audit

from harness import Daemon, wait_for
from spx.daemon.service import control

N = 1000


@pytest.mark.slow(seconds=175)
def test_a_thousand_jobs_at_once_are_all_recorded_and_the_daemon_keeps_answering(tmp_path, daemons, scenario):
    d = Daemon(tmp_path / "root", gpu_backend="fake")
    daemons.append(d)
    d.start()
    # One job holds all 8 GPUs; the thousand each want one, so they stay queued behind it.
    hog = CountedJob("hog", tmp_path / "hog.ledger", seconds=600, gpus=8, expect="cancelled")
    d.drop("hog.yaml", hog.yaml())
    wait_for(lambda: (d.job("hog") or {}).get("state") == "running", 30, "the hog to run")
    jobs = [CountedJob(f"q-{i:04d}", tmp_path / "ledgers" / f"q-{i:04d}.ledger", gpus=1, expect="cancelled")
            for i in range(N)]
    for j in jobs:
        d.drop(f"{j.name}.yaml", j.yaml())
    answers = []
    while True:
        started = time.monotonic()
        listed = d.ls()
        answers.append(time.monotonic() - started)
        if sum(j["name"].startswith("q-") for j in listed) == N:
            break
        assert d.alive() and len(answers) < 300, f"{len(listed)} listed after {len(answers)} tries"
    assert max(answers) < 10, f"spx ls took up to {max(answers):.1f} s while the jobs came in"
    assert all(j["state"] == "queued" for j in listed if j["name"].startswith("q-"))
    scenario.survived = d.alive()
    # Cancel them all through the same socket client `spx cancel` uses (one process per job is slow).
    socket = d.root / "run" / "spx.sock"
    replies = [control.request(socket, "cancel", j.name) for j in [*jobs, hog]]
    assert all(r["ok"] for r in replies), [r for r in replies if not r["ok"]][:3]
    wait_for(lambda: all(j["state"] == "cancelled" for j in d.ls() if j["name"] in {"hog", *(x.name for x in jobs)}),
             120, "every job cancelled")
    assert d.alive()
    d.stop()
    result = audit(d.root / "state" / "spx.sqlite", [*jobs, hog])
    scenario.record(result)
    assert result.clean, result
    assert not any(j.runs() for j in jobs), "a queued job ran"
