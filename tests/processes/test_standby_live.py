"""standby.start / go / discard with real processes: a launcher started ahead becomes the attempt
with exactly the plan it is given; one that never gets a plan is never taken for the job's end."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from harness import wait_for
from spx.daemon.run import launcher, proctree, standby
from spx.daemon.run.launcher import LaunchPlan

PROBE = """
import json, os, sys
json.dump({"argv": sys.argv[1:], "env": dict(os.environ), "path0": sys.path[0], "path": sys.path,
           "stdin": sys.stdin.read(), "name": __name__, "preimported": "json" in sys.modules},
          open(os.environ["PROBE_OUT"], "w"))
sys.exit(7)
"""


@pytest.fixture
def probe(tmp_path, monkeypatch) -> Path:
    """A launcher module of our own (`python -m probe`), prepared with a stdlib import ahead."""
    (tmp_path / "probe.py").write_text(PROBE)
    monkeypatch.setitem(standby.PREIMPORTS, "probe", "json")
    return tmp_path


def plan(cwd: Path, attempt_id: str, **env: str) -> LaunchPlan:
    base = {"PATH": launcher.SAFE_PATH, "SPX_ATTEMPT_ID": attempt_id, "PROBE_OUT": str(cwd / "out.json"),
            "CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    return LaunchPlan(argv=[sys.executable, "-m", "probe", "a", "b"], env={**base, **env}, cwd=str(cwd))


def start(p: LaunchPlan, cwd: Path, name: str = "attempt-2.log") -> standby.Standby:
    fd = os.open(cwd, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ready = standby.start(2, p.env["SPX_ATTEMPT_ID"], p, os.getuid(), fd, name, None, 1 << 20)
    finally:
        os.close(fd)
    assert ready is not None
    return ready


def agent_pid(ready: standby.Standby) -> int:
    return int(wait_for(lambda: Path(f"/proc/{ready.pid}/task/{ready.pid}/children").read_text().split(), 10,
                        "the agent")[0])


def test_a_standby_becomes_the_attempt_with_exactly_the_plan_it_is_given(probe):
    ready = start(plan(probe, "s1", STAGE="early"), probe)
    pid = agent_pid(ready)
    wait_for(lambda: b"CUDA_VISIBLE_DEVICES=\0" in Path(f"/proc/{pid}/environ").read_bytes(), 10, "the agent's exec")
    final = plan(probe, "s1", STAGE="final", CUDA_VISIBLE_DEVICES="3")
    assert ready.fits(final)
    spawned = ready.go(final)
    assert spawned.proc.wait(timeout=30) == 7, "the attempt's end is the monitor's, as with a cold launch"
    spawned.relay.wait(timeout=30)
    seen = json.loads((probe / "out.json").read_text())
    assert seen["argv"] == ["a", "b"] and seen["name"] == "__main__" and seen["preimported"]
    assert seen["env"]["STAGE"] == "final" and seen["env"]["CUDA_VISIBLE_DEVICES"] == "3"
    assert seen["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert seen["path0"] == str(probe), "sys.path as `python -m` has it"
    assert not any(p.endswith("daemon/run") for p in seen["path"]), "the daemon's modules never shadow the job's"
    assert seen["stdin"] == "", "stdin is /dev/null again"
    record = launcher.recorded_exit(probe, "attempt-2.log", "s1")
    assert record is not None and (record.launched, record.exit_code) == (True, 7)


def test_until_its_plan_a_standby_sees_no_gpu():
    env = plan(Path("/"), "s0").env
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    with_no_gpu = {k: v for k, v in env.items() if k != "CUDA_DEVICE_ORDER"} | {"CUDA_VISIBLE_DEVICES": ""}
    fd, ready = None, None
    try:
        fd = os.open("/tmp", os.O_RDONLY | os.O_DIRECTORY)
        ready = standby.start(1, "s0", LaunchPlan([sys.executable, "-m", "torch.distributed.run"], env, "/"),
                              os.getuid(), fd, f"spx-test-{os.getpid()}.log", None, 1 << 20)
        assert ready is not None
        pid = agent_pid(ready)
        wait_for(lambda: "standby_agent.py" in Path(f"/proc/{pid}/cmdline").read_text(), 10, "the agent's exec")
        items = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        seen = dict(i.decode().split("=", 1) for i in items if b"=" in i)
        assert seen == with_no_gpu
    finally:
        if ready is not None:
            ready.discard()
        if fd is not None:
            os.close(fd)


def test_a_discarded_standby_leaves_no_process_and_no_record(probe):
    ready = start(plan(probe, "s2"), probe)
    agent_pid(ready)
    ready.discard()  # kills the whole session and waits for nothing (the daemon's reaper collects it)
    ready.monitor.proc.wait(timeout=30)
    ready.monitor.relay.wait(timeout=30)  # EOF: every process that held the attempt's output is gone
    assert ready.monitor.proc.poll() is not None
    assert proctree.attempt_pids("s2") == []
    assert launcher.recorded_exit(probe, "attempt-2.log", "s2") is None
    assert not (probe / "out.json").exists(), "nothing of the job ran"


def test_a_plan_that_never_comes_is_recorded_as_never_launched(probe):
    """The daemon died before it gave the plan: the standby ends, and no next daemon takes its end
    for the job's (an exit 0 would read as a job that succeeded)."""
    ready = start(plan(probe, "s3"), probe)
    os.close(ready.monitor.plan_w)  # what the daemon's death does to its end of the pipe
    ready.monitor.plan_w = -1
    ready.monitor.proc.wait(timeout=30)
    record = wait_for(lambda: launcher.recorded_exit(probe, "attempt-2.log", "s3"), 10, "the exit record")
    assert (record.launched, record.exit_code) == (False, 127)
    ready.discard()


def test_a_standby_that_could_not_start_fails_at_go_as_a_launch_would(probe):
    p = plan(probe, "s4")
    bad = LaunchPlan(p.argv, p.env, str(probe / "no-such-dir"))
    ready = start(bad, probe)
    with pytest.raises(OSError, match="workdir"):
        ready.go(bad)
    record = wait_for(lambda: launcher.recorded_exit(probe, "attempt-2.log", "s4"), 10, "the exit record")
    assert record.launched is False


def test_a_standby_gone_before_its_plan_is_a_failed_go_not_a_job_end(probe):
    ready = start(plan(probe, "s5"), probe)
    pid = agent_pid(ready)
    wait_for(lambda: "standby_agent.py" in Path(f"/proc/{pid}/cmdline").read_text(), 10, "the agent's exec")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: proctree._is_zombie(pid) or not Path(f"/proc/{pid}").exists(), 10, "the agent's end")
    with pytest.raises(OSError, match="standby ended"):
        ready.go(plan(probe, "s5"))
    record = wait_for(lambda: launcher.recorded_exit(probe, "attempt-2.log", "s5"), 10, "the exit record")
    assert record.launched is False
    assert not (probe / "out.json").exists()


@pytest.mark.parametrize(("ending", "status", "said"), [
    ("print('unflushed', end='')", 0, "unflushed"),
    ("raise RuntimeError('worker 1 died')", 1, "RuntimeError: worker 1 died"),
    ("sys.exit('no GPUs left')", 1, "no GPUs left"),
    ("sys.exit(300)", 300 & 0xFF, None),
])
def test_the_launchers_end_is_pythons_without_its_teardown(probe, ending, status, said):
    """The agent leaves with os._exit once the launcher module is done: the status, the traceback and
    the last buffered output are what `python -m` would give."""
    (probe / "probe.py").write_text(f"import sys\n{ending}\n")
    ready = start(plan(probe, "s7"), probe)
    spawned = ready.go(plan(probe, "s7"))
    assert spawned.proc.wait(timeout=30) == status
    spawned.relay.wait(timeout=30)
    log_file = probe / "attempt-2.log"
    log = log_file.read_text() if log_file.exists() else ""
    assert said is None or said in log, log
    if "raise" in ending:
        assert "Traceback (most recent call last)" in log, log


def test_torchrun_runs_from_its_standby(tmp_path):
    """The real launcher: `torch.distributed.run`, imported ahead, starts its worker with the plan."""
    (tmp_path / "w.py").write_text("import json, os, sys\n"
                                   "json.dump({k: os.environ.get(k) for k in ('RANK', 'WORLD_SIZE', 'STAGE')} | "
                                   "{'argv': sys.argv[1:]}, open(os.environ['PROBE_OUT'], 'w'))\n")
    env = {"PATH": launcher.SAFE_PATH, "SPX_ATTEMPT_ID": "s6", "PROBE_OUT": str(tmp_path / "out.json"),
           "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=1",
            "--master-addr=127.0.0.1", f"--master-port={launcher.free_port()}", "--max-restarts=0",
            str(tmp_path / "w.py"), "--x", "1"]
    ready = start(LaunchPlan(argv, env | {"STAGE": "early"}, str(tmp_path)), tmp_path)
    spawned = ready.go(LaunchPlan(argv, env | {"STAGE": "final"}, str(tmp_path)))
    assert spawned.proc.wait(timeout=120) == 0
    spawned.relay.wait(timeout=30)
    assert json.loads((tmp_path / "out.json").read_text()) == {"RANK": "0", "WORLD_SIZE": "1", "STAGE": "final",
                                                               "argv": ["--x", "1"]}
    log = tmp_path / "attempt-2.log"
    assert not log.exists() or "Warning" not in log.read_text(), "as quiet as `python -m torch.distributed.run`"
