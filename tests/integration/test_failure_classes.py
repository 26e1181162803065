"""Failure classes and the restart policy per class, with a real daemon and real jobs (issue 15):
the root rank and its exception named in `spx status`, the other ranks' errors as consequences, the
class in the history and as the `reason` label of spx_job_restarts_total, and an early user-code
exception restarted once (restart.on_failure's default), not forever."""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import Daemon

SCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"
PY = sys.executable

pytestmark = pytest.mark.slow


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path / "root").start()
    yield d
    d.stop()


def restarts_by_reason(d: Daemon, job: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=30).read().decode()
    return {s.labels["reason"]: s.value
            for fam in text_string_to_metric_families(text) if fam.name == "spx_job_restarts"
            for s in fam.samples if s.name == "spx_job_restarts_total" and s.labels.get("spx_job") == job}


def test_rank_1_raising_first_is_the_root_cause_and_rank_0s_broken_connection_a_consequence(daemon):
    """2 gloo ranks under torchrun: rank 1 raises ValueError at step 3, rank 0 dies in its next
    all_reduce of the closed connection. Default policy: restarted once (early user-code), then failed."""
    daemon.drop("r.yaml", f"name: ranks\nlauncher: torchrun\nscript: {SCRIPTS / 'rank1_raises.py'}\npython: {PY}\n"
                          "procs: 2\nrestart: {backoff_seconds: [1, 1]}\nstop: {grace_seconds: 10}\n")
    daemon.wait_state("ranks", "failed", 240)
    st = daemon.status("ranks")
    assert len(st["history"]) == 2 and [a["reason_class"] for a in st["history"]] == ["user-code", "user-code"], st
    assert "restart.on_failure.user-code.max: 1" in st["reason"], st["reason"]
    for attempt in st["history"]:
        cause = attempt["root_cause"]
        assert cause.startswith("rank 1 (pid ") and ": ValueError: bad batch at step 3 (user-code); " in cause, cause
        assert "rank 0: RuntimeError: Connection closed by peer" in cause and cause.endswith("(consequence)"), cause
    text = daemon.spx("status", "ranks", check=False).stdout  # exits non-zero: the job failed
    assert f"last failure (attempt 2): user-code: {st['history'][1]['root_cause']}" in text, text
    assert text.count("[user-code]") == 2 and text.count("root cause: rank 1 (pid ") == 2, text
    assert restarts_by_reason(daemon, "ranks") == {"user-code": 1.0}


def test_a_valueerror_at_step_0_fails_after_two_attempts_as_user_code(daemon):
    """The crash-loop case under the default restart policy (max_restarts 10): not 3 attempts (the
    crash-loop guard), not 11, but 2 — restart.on_failure.user-code {max: 1, within_first_seconds: 120}."""
    daemon.drop("c.yaml", f"name: crasher\nlauncher: python\nscript: {SCRIPTS / 'always_crash.py'}\npython: {PY}\n"
                          "restart: {backoff_seconds: [1, 1]}\n")
    daemon.wait_state("crasher", "failed", 60)
    st = daemon.status("crasher")
    assert [a["reason_class"] for a in st["history"]] == ["user-code"] * 2, st
    assert st["history"][1]["root_cause"] == "ValueError: learning rate must be positive (user-code)"
    assert st["reason"] == st["history"][1]["reason"] == ("gave up: exit code 1 within 120 s of its start, after 1 "
                                                          "earlier user-code failure (restart.on_failure.user-code.max: 1)")
    assert restarts_by_reason(daemon, "crasher") == {"user-code": 1.0}
