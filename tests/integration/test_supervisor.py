"""The supervisor with real processes: torchrun (gloo on CPU), signals, kill -9, /proc checks."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from harness import EXAMPLES, Daemon, attempt_tag, job_pids, wait_for
from spx.daemon.run import proctree
from spx.daemon.state.phases import ALL_PHASES

SCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"
PY = sys.executable


def ddp_job(name: str, *args: str, restart: str = "{max_restarts: 3, backoff_seconds: [1, 10]}", gpus: int = 2,
            extra: str = "") -> str:
    argv = ", ".join(f'"{a}"' for a in ("--batch_size", "4", "--model-size", "tiny", "--seed", "7", *args))
    return (f"name: {name}\nlauncher: torchrun\nscript: {EXAMPLES / 'train_ddp.py'}\npython: {PY}\n"
            f"args: [{argv}]\ngpus: {gpus}\nprocs: 2\nrestart: {restart}\nstop: {{grace_seconds: 30}}\n{extra}")


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path / "root", gpu_backend="fake").start()
    yield d
    d.stop()


def worker_pids(name: str) -> list[int]:
    pids = []
    for pid in job_pids(name):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(c.endswith(b"train_ddp.py") for c in cmd) and b"torch.distributed.run" not in cmd:
            pids.append(pid)
    return pids


@pytest.mark.slow
def test_torchrun_job_crashing_once_resumes_from_last_checkpoint_and_succeeds(daemon):
    daemon.drop("crash.yaml", ddp_job("crash-once", "--steps", "40", "--checkpoint-every", "10", "--crash-at-step", "25"))
    daemon.wait_state("crash-once", {"succeeded", "failed"}, 300)
    st = daemon.status("crash-once")
    assert st["state"] == "succeeded", st
    first, second = st["history"]
    assert first["reason"] == "exit code 1" and first["resumed_from_step"] is None
    assert second["resumed_from_step"] == 20, "attempt 2 resumes from the last checkpoint before the crash"
    assert 25 - second["resumed_from_step"] <= 10, "no step trained twice beyond the checkpoint interval"
    log2 = (daemon.root / "log" / "crash-once" / "attempt-2.log").read_text()
    assert "resuming from" in log2 and "step-000000020" in log2
    assert "final_state_sha256=" in log2


@pytest.mark.slow
def test_kill9_of_one_worker_takes_the_group_down_and_the_job_resumes(daemon):
    daemon.drop("k.yaml", ddp_job("kill-worker", "--steps", "60", "--checkpoint-every", "5", "--sleep-per-step", "0.2"))
    wait_for(lambda: (daemon.job("kill-worker") or {}).get("step") and daemon.job("kill-worker")["step"] >= 12,
             240, "training progress")
    assert_the_standby_is_shown(daemon, "kill-worker")
    victims = worker_pids("kill-worker")
    assert len(victims) == 2
    attempt1 = job_pids("kill-worker", attempt_tag(victims[0]))
    os.kill(victims[1], signal.SIGKILL)
    wait_for(lambda: daemon.job("kill-worker")["attempts"] >= 2, 120, "second attempt")
    assert not set(attempt1) & set(job_pids("kill-worker")), "a process of attempt 1 survived"
    daemon.wait_state("kill-worker", {"succeeded", "failed"}, 300)
    st = daemon.status("kill-worker")
    assert st["state"] == "succeeded" and st["history"][1]["resumed_from_step"] >= 10
    # Attempt 2's launcher was started during attempt 1 (a standby, daemon/run/standby.py); the one
    # started for attempt 3 went with the job's end, with its cgroup and log.
    assert daemon.events("attempt_started", job="kill-worker", attempt=2)[0]["standby"] > 0
    assert job_pids("kill-worker") == []
    assert sorted(p.name for p in (daemon.root / "log" / "kill-worker").glob("attempt-3*")) == []
    # Where the relaunch spent its time (spx status --timeline): every phase recorded, in order.
    rows = json.loads(daemon.spx("status", "kill-worker", "--timeline", "--json").stdout)
    relaunch = [r for r in rows if r["attempt"] == 2]
    assert [r["phase"] for r in relaunch] == [p for p in ALL_PHASES if p != "joined"], relaunch  # joined: across hosts
    times = [r["time"] for r in relaunch]
    assert times == sorted(times), relaunch


def assert_the_standby_is_shown(daemon: Daemon, name: str) -> None:
    """The next attempt's launcher, started during this one with torch imported: what it holds is in
    `spx status` (--json and the text) and /metrics, the job's gauge and the host's."""
    def torch_imported() -> int | None:
        held = daemon.status(name).get("standby_memory_bytes")
        return held if held is not None and held > 64 * 2**20 else None

    held = wait_for(torch_imported, 120, "the standby's memory with torch imported")
    print(f"{name}: standby holds {held / 2**20:.0f} MiB (Pss)")
    assert re.search(r"^  standby: next attempt's launcher ready, \d+ MiB \(launch_standby\)$",
                     daemon.spx("status", name).stdout, re.M)
    text = urllib.request.urlopen(f"http://127.0.0.1:{daemon.metrics_port}/metrics", timeout=30).read().decode()
    job = re.search(rf'^spx_job_standby_memory_bytes{{spx_job="{name}"}} (\S+)$', text, re.M)
    host = re.search(r"^spx_standby_memory_bytes (\S+)$", text, re.M)
    assert job is not None and float(job[1]) > 64 * 2**20, text[-2000:]
    assert host is not None and host[1] == job[1], "the host's sum, from the scrape's one read of the views"


def test_setsid_grandchild_ignoring_sigterm_is_gone_after_cancel(daemon, tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    daemon.drop("g.yaml", f"name: escaper\nlauncher: python\nscript: {SCRIPTS / 'setsid_grandchild.py'}\n"
                          f"python: {PY}\nargs: ['{pidfile}']\nstop: {{grace_seconds: 2}}\n")
    wait_for(pidfile.exists, 30, "grandchild started")
    grandchild = int(pidfile.read_text())
    assert len({os.getsid(p) for p in job_pids("escaper")}) == 2, "the grandchild left the attempt's session"
    daemon.spx("cancel", "escaper")
    daemon.wait_state("escaper", "cancelled", 30)
    assert not Path(f"/proc/{grandchild}").exists() or proctree._is_zombie(grandchild)
    assert job_pids("escaper") == []


@pytest.mark.slow
def test_hung_worker_is_detected_its_stacks_logged_and_it_is_restarted(daemon):
    """No hang_timeout_seconds: the timeout is calibrated from the job's step intervals (~1 s steps:
    the 10 s floor on a quiet machine; more when the machine is loaded and steps vary), not 900 s."""
    daemon.drop("h.yaml", ddp_job("hangs", "--steps", "20", "--checkpoint-every", "5", "--hang-at-step", "12",
                                  "--sleep-per-step", "1", restart="{max_restarts: 3, backoff_seconds: [1, 5]}"))
    hang = daemon.wait_event("hang_detected", job="hangs", timeout=600)
    assert hang["timeout_seconds"] < 900, "calibrated, not the ceiling"
    assert hang["timeout_seconds"] <= hang["idle_seconds"] <= hang["timeout_seconds"] + 5, "both rounded to 0.1 s"
    daemon.wait_state("hangs", {"succeeded", "failed"}, 300)
    st = daemon.status("hangs")
    assert st["state"] == "succeeded" and st["history"][0]["reason"].startswith("hang")
    log1 = (daemon.root / "log" / "hangs" / "attempt-1.log").read_text()
    assert "stack of pid" in log1 and "train_ddp.py" in log1.split("stack of pid", 1)[1]


def test_always_crashing_job_fails_as_crash_loop_with_backoff_while_others_run(daemon):
    daemon.drop("c.yaml", f"name: crasher\nlauncher: python\nscript: {SCRIPTS / 'always_crash.py'}\npython: {PY}\n"
                          "restart: {max_restarts: 10, backoff_seconds: [1, 8], on_failure: {user-code: counted}}\n")
    daemon.drop("o.yaml", f"name: bystander\nlauncher: python\nscript: {SCRIPTS / 'sleep_for.py'}\npython: {PY}\n"
                          "args: ['3']\n")
    daemon.wait_state("crasher", {"failed"}, 60)
    st = daemon.status("crasher")
    assert st["reason"].startswith("crash loop") and len(st["history"]) == 3
    gaps = [b["start"] - a["end"] for a, b in zip(st["history"], st["history"][1:], strict=False)]
    assert gaps[0] >= 0.9 and gaps[1] >= 1.9, f"exponential backoff between attempts, got {gaps}"
    assert st["history"][0]["root_cause"] == "ValueError: learning rate must be positive (user-code)"
    daemon.wait_state("bystander", "succeeded", 60)
    assert daemon.alive()


def test_two_2gpu_jobs_share_the_host_and_an_8gpu_job_waits(daemon, tmp_path):
    gate = tmp_path / "release"  # the two small jobs hold their GPUs until the checks are done

    def job(name, gpus, script, args):
        return (f"name: {name}\nlauncher: python\nscript: {SCRIPTS / script}\npython: {PY}\n"
                f"args: {args}\ngpus: {gpus}\n")

    daemon.drop("a.yaml", job("small-a", 2, "wait_for_file.py", [str(gate)]))
    daemon.drop("b.yaml", job("small-b", 2, "wait_for_file.py", [str(gate)]))
    a = daemon.wait_state("small-a", "running", 20)
    b = daemon.wait_state("small-b", "running", 20)
    daemon.drop("c.yaml", job("big-c", 8, "sleep_for.py", ["1"]))
    c = daemon.wait_state("big-c", "queued", 20)
    assert not set(a["gpus"]) & set(b["gpus"]) and len(a["gpus"]) == len(b["gpus"]) == 2
    assert daemon.job("small-a")["state"] == "running" and c["gpus"] == []
    gate.touch()
    daemon.wait_state("big-c", {"running", "succeeded"}, 60)
    assert {daemon.job("small-a")["state"], daemon.job("small-b")["state"]} == {"succeeded"}
    done = daemon.wait_state("big-c", "succeeded", 60)
    assert done["attempts"] == 1


@pytest.mark.slow
def test_daemon_stop_lets_the_job_checkpoint_and_the_next_start_resumes_it(tmp_path):
    d = Daemon(tmp_path / "root", gpu_backend="fake").start()
    try:
        d.drop("s.yaml", ddp_job("survivor", "--steps", "60", "--checkpoint-every", "50", "--sleep-per-step", "0.2"))
        wait_for(lambda: ((d.job("survivor") or {}).get("step") or 0) >= 7, 240, "training progress")
        assert d.stop() == 0
        assert job_pids("survivor") == [], "a worker outlived the daemon's stop"
        ckpts = sorted(p.name for p in d.checkpoint_dir("survivor").glob("step-*"))
        assert ckpts and ckpts[-1] < "step-000000050", f"a SIGTERM checkpoint of the current step, got {ckpts}"
        stopped_at = int(ckpts[-1].split("-")[1])
        d.start()
        d.wait_state("survivor", {"succeeded", "failed"}, 300)
        st = d.status("survivor")
        assert st["state"] == "succeeded", st
        first, second = st["history"]
        assert first["reason"] == "daemon stopped; resumes on next start", first
        assert second["resumed_from_step"] == stopped_at
    finally:
        d.stop()


@pytest.mark.slow
def test_cancel_gives_the_workers_their_grace_to_checkpoint(daemon):
    daemon.drop("c.yaml", ddp_job("cancel-me", "--steps", "200", "--checkpoint-every", "100", "--sleep-per-step", "0.2"))
    wait_for(lambda: ((daemon.job("cancel-me") or {}).get("step") or 0) >= 5, 240, "training progress")
    daemon.spx("cancel", "cancel-me")
    daemon.wait_state("cancel-me", "cancelled", 60)
    assert job_pids("cancel-me") == []
    ckpts = sorted(daemon.checkpoint_dir("cancel-me").glob("step-*"))
    assert ckpts and (ckpts[-1] / "COMPLETE.json").exists(), "cancel is a SIGTERM: the workers checkpoint first"


def test_a_running_attempt_outlives_the_daemon_and_is_adopted_as_it_is(tmp_path):
    """max_restarts: 1 — attempt 1 runs across a daemon kill -9 (same pid, same attempt, not counted),
    then crashes (the one restart allowed); attempt 2 succeeds."""
    script = tmp_path / "crash_on_1.py"
    release = tmp_path / "release"
    script.write_text("import os, sys, time\nn = int(os.environ['SPX_ATTEMPT'])\n"
                      f"while n == 1 and not os.path.exists({str(release)!r}):\n    time.sleep(0.1)\n"
                      "sys.exit(1 if n == 1 else 0)\n")
    d = Daemon(tmp_path / "root").start()
    try:
        d.drop("m.yaml", f"name: once\nlauncher: python\nscript: {script}\npython: {PY}\n"
                         "restart: {max_restarts: 1, backoff_seconds: [1, 1]}\nstop: {grace_seconds: 5}\n")
        d.wait_state("once", "running", 30)
        pids = wait_for(lambda: job_pids("once"), 30, "the job's process")
        d.kill9()
        d.start()
        adopted = d.wait_event("adopted_after_restart", job="once")
        assert adopted["exited"] is False and adopted["pids"], adopted
        assert job_pids("once") == pids and d.job("once")["state"] == "running"
        release.touch()
        d.wait_state("once", {"succeeded", "failed"}, 60)
        st = d.status("once")
        assert st["state"] == "succeeded", st
        assert [a["reason"] for a in st["history"]] == ["exit code 1", "exit code 0"]
        assert job_pids("once") == []
    finally:
        d.stop()


def test_a_job_that_exits_0_while_the_daemon_is_down_succeeded_with_its_real_exit_time(tmp_path):
    ran = tmp_path / "ran"
    script = tmp_path / "once.py"
    script.write_text(f"import time\ntime.sleep(2)\nopen({str(ran)!r}, 'a').write('x')\n")
    d = Daemon(tmp_path / "root").start()
    try:
        d.drop("e.yaml", f"name: quiet\nlauncher: python\nscript: {script}\npython: {PY}\n")
        d.wait_state("quiet", "running", 30)
        d.kill9()
        wait_for(lambda: ran.exists() and not job_pids("quiet"), 30, "the job to end with no daemon")
        ended = time.time()
        time.sleep(1.5)
        restarted = time.time()
        d.start()
        d.wait_state("quiet", "succeeded", 30)
        attempt = d.status("quiet")["history"][-1]
        assert len(d.status("quiet")["history"]) == 1 and ran.read_text() == "x", "its script ran once"
        assert ended - 1.5 <= attempt["end"] < restarted, "the end is when it ended, not when the daemon saw it"
    finally:
        d.stop()


def test_a_backoff_interrupted_by_a_daemon_stop_resumes_with_the_seconds_left(tmp_path):
    import sqlite3

    d = Daemon(tmp_path / "root", log_level="debug").start()  # debug: wait_turns
    try:
        d.drop("b.yaml", f"name: backs-off\nlauncher: python\nscript: {SCRIPTS / 'always_crash.py'}\npython: {PY}\n"
                         "restart: {max_restarts: 5, backoff_seconds: [30, 30]}\n")
        d.wait_state("backs-off", "restarting", 30)
        time.sleep(3)
        assert d.stop() == 0
        db = sqlite3.connect(f"file:{d.root / 'state' / 'spx.sqlite'}?mode=ro", uri=True)
        (left,) = db.execute("SELECT backoff_remaining FROM jobs WHERE name = 'backs-off'").fetchone()
        db.close()
        assert 20 < left < 28, f"about 30 s minus the 3+ s already waited, got {left}"
        d.start()
        d.wait_turns()  # whole turns of the restarted daemon: a relaunch at once would have begun
        j = d.wait_state("backs-off", "restarting", 10)
        assert j["attempts"] == 1, "the backoff resumes: no relaunch at once"
    finally:
        d.stop()


def test_a_cancel_outlives_a_daemon_killed_during_the_grace(tmp_path):
    script = tmp_path / "ignores_term.py"
    script.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(120)\n")
    d = Daemon(tmp_path / "root").start()
    try:
        d.drop("c.yaml", f"name: stubborn\nlauncher: python\nscript: {script}\npython: {PY}\n"
                         "stop: {grace_seconds: 4}\n")
        d.wait_state("stubborn", "running", 30)
        d.spx("cancel", "stubborn")
        d.kill9()  # during the grace: the attempt still runs, its end not recorded
        assert job_pids("stubborn")
        d.start()
        d.wait_state("stubborn", "cancelled", 30)
        assert d.status("stubborn")["attempts"] == 1 and job_pids("stubborn") == []
    finally:
        d.stop()
