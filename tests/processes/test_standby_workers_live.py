"""Standby workers with a real torchrun (gloo, 2 ranks): the agent's standby workers, started before
the plan, become the attempt's workers — the same pids torchrun then watches — and run the script
as the cold worker would (argv, sys.path, __main__, the plan's environment, stdin, the rank's log
files, the daemon's nice where the standby waited at nice 19) and shows the cold worker's command line; a rank without one starts cold, a script that sets a variable before its `import torch` is started again cold, and a standby worker left over ends quietly (exit 0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness import wait_for
from spx.daemon.run import launcher, proctree, standby
from spx.daemon.run.launcher import LaunchPlan, free_port

WORKER = Path(standby.AGENT).with_name("standby_worker.py")

SCRIPT = """
import sys
preimported = "torch._dynamo" in sys.modules  # before the script's own imports: a standby worker's
import json, os
if os.environ.get("SET_BEFORE_TORCH"):  # a script's own setting, made before its torch is imported
    os.environ["TORCH_SHOW_CPP_STACKTRACES"] = os.environ["SET_BEFORE_TORCH"]
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
rank = os.environ["RANK"]
print(f"rank {rank} says hello", flush=True)
def nices(pid):  # each thread's nice value (stat's 19th field)
    return sorted({int(open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()[16])
                   for t in os.listdir(f"/proc/{pid}/task")})
json.dump({"nices": nices(os.getpid()), "launcher_nices": nices(os.getppid()), "preimported": preimported, "pid": os.getpid(), "argv": sys.argv, "path0": sys.path[0],
           "name": __name__, "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "stage": os.environ.get("STAGE"),
           "set": os.environ.get("TORCH_SHOW_CPP_STACKTRACES"),
           "stdin": sys.stdin.read(), "total": total.item(), "cwd": os.getcwd(),
           "cmdline": open("/proc/self/cmdline", "rb").read().rstrip(bytes(1)).decode().split(chr(0))},
          open(os.path.join(os.environ["OUT"], f"rank{rank}.json"), "w"))
dist.destroy_process_group()
"""


def torchrun_plan(work: Path, attempt_id: str, nproc: int, **env: str) -> LaunchPlan:
    (work / "train.py").write_text(SCRIPT)
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}",
            "--master-addr=127.0.0.1", f"--master-port={free_port()}", "--max-restarts=0", "--tee=3",
            f"--log-dir={work / 'ranks'}", str(work / "train.py"), "x", "--y"]
    base = {"PATH": f"{Path(sys.executable).parent}:{launcher.SAFE_PATH}", "SPX_ATTEMPT_ID": attempt_id,
            "OUT": str(work), "OMP_NUM_THREADS": "1", "HOME": str(work)}
    return LaunchPlan(argv=argv, env={**base, **env}, cwd=str(work))


def start(p: LaunchPlan, work: Path, workers: int) -> standby.Standby:
    fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ready = standby.start(2, p.env["SPX_ATTEMPT_ID"], p, os.getuid(), fd, "attempt-2.log", None, 1 << 22,
                              workers=workers)
    finally:
        os.close(fd)
    assert ready is not None and ready.workers == workers
    return ready


def thread_nices(pid: int) -> set[int]:
    return {int((task / "stat").read_text().rsplit(")", 1)[1].split()[16]) for task in Path(f"/proc/{pid}/task").iterdir()}


def standby_workers(ready: standby.Standby, count: int) -> list[int]:
    """The agent's children that are standby workers, once `count` of them have their imports done
    (each then waits on its stdin, a pipe)."""
    def found():
        agent = [int(p) for p in Path(f"/proc/{ready.pid}/task/{ready.pid}/children").read_text().split()]
        kids = [int(p) for a in agent for p in proctree.children(a)]
        waiting = [p for p in kids if "standby_worker.py" in Path(f"/proc/{p}/cmdline").read_text()
                   and Path(f"/proc/{p}/syscall").read_text().startswith("0 0x0 ")]  # read(0, …)
        return sorted(waiting) if len(waiting) == count else None
    return wait_for(found, 120, f"{count} standby workers with their imports done", interval=0.2)


def test_standby_workers_become_torchruns_workers_and_run_the_script_as_a_cold_worker_would(tmp_path):
    ready = start(torchrun_plan(tmp_path, "w1", 2, STAGE="early"), tmp_path, workers=2)
    try:
        before = standby_workers(ready, 2)
        for pid in before:
            assert b"CUDA_VISIBLE_DEVICES=\0" in Path(f"/proc/{pid}/environ").read_bytes(), "no GPU before the plan"
        for pid in [*before, *proctree.children(ready.pid)]:
            assert thread_nices(pid) == {standby.NICE}, "every thread of the standby waits at the lowest priority"
        final = torchrun_plan(tmp_path, "w1", 2, STAGE="final", CUDA_VISIBLE_DEVICES="")
        assert ready.fits(final)
        spawned = ready.go(final)
        assert spawned.proc.wait(timeout=120) == 0, (tmp_path / "attempt-2.log").read_text()[-3000:]
        spawned.relay.wait(timeout=30)
    finally:
        ready.discard()
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert sorted(s["pid"] for s in seen) == before, "torchrun's workers are the standby workers started ahead"
    for s in seen:
        assert s["preimported"] and s["name"] == "__main__" and s["total"] == 3.0
        assert s["nices"] == s["launcher_nices"] == [os.getpriority(os.PRIO_PROCESS, 0)], "the plan brought them back"
        assert s["argv"] == [str(tmp_path / "train.py"), "x", "--y"] and s["path0"] == str(tmp_path)
        assert s["stage"] == "final" and s["stdin"] == "" and s["cwd"] == str(tmp_path)
        assert s["cmdline"] == [sys.executable, "-u", str(tmp_path / "train.py"), "x", "--y"], "ps shows the cold command"
    log = (tmp_path / "attempt-2.log").read_text()
    assert "rank 0 says hello" in log and "rank 1 says hello" in log, "the rank's output reaches torchrun's tee"
    assert any("rank 1 says hello" in p.read_text() for p in (tmp_path / "ranks").rglob("stdout.log"))


def test_a_rank_without_a_standby_worker_starts_cold_and_a_left_over_one_ends_quietly(tmp_path):
    ready = start(torchrun_plan(tmp_path, "w2", 1), tmp_path, workers=2)
    try:
        before = standby_workers(ready, 2)
        spawned = ready.go(torchrun_plan(tmp_path, "w2", 1))
        assert spawned.proc.wait(timeout=120) == 0, (tmp_path / "attempt-2.log").read_text()[-3000:]
        spawned.relay.wait(timeout=30)
    finally:
        ready.discard()
    seen = json.loads((tmp_path / "rank0.json").read_text())
    assert seen["pid"] in before and seen["preimported"]
    left = [p for p in before if p != seen["pid"]]
    # Its parent (the agent) has ended: the left-over worker's end went to init, which reaped it.
    wait_for(lambda: not any(Path(f"/proc/{p}").exists() and not proctree._is_zombie(p) for p in left), 30,
             "the left-over standby worker's end")
    assert proctree.attempt_pids("w2") == []


def test_a_script_that_sets_a_variable_before_importing_torch_is_started_again_cold_in_the_same_pid(tmp_path):
    """The standby worker's torch read the standby's environment: a cold worker's would have read the
    script's setting, so the script runs again in a fresh interpreter (exec: the pid torchrun watches)."""
    plan = torchrun_plan(tmp_path, "w3", 1, SET_BEFORE_TORCH="1")
    ready = start(plan, tmp_path, workers=1)
    try:
        before = standby_workers(ready, 1)
        spawned = ready.go(plan)
        assert spawned.proc.wait(timeout=120) == 0, (tmp_path / "attempt-2.log").read_text()[-3000:]
        spawned.relay.wait(timeout=30)
    finally:
        ready.discard()
    seen = json.loads((tmp_path / "rank0.json").read_text())
    assert seen["pid"] == before[0] and not seen["preimported"], "the standby worker's pid, a cold interpreter"
    assert seen["set"] == "1" and seen["argv"] == [str(tmp_path / "train.py"), "x", "--y"]
    assert "set SET_BEFORE_TORCH" not in (tmp_path / "attempt-2.log").read_text()
    assert "set TORCH_SHOW_CPP_STACKTRACES before `import torch`" in (tmp_path / "attempt-2.log").read_text()


def test_a_standby_worker_given_no_command_ends_with_0():
    """EOF before a command: no rank for it, or its agent discarded. A nonzero end would read as a
    worker's death to the daemon's worker watch, which finds it by its LOCAL_RANK."""
    proc = subprocess.run([sys.executable, "-u", str(WORKER)], stdin=subprocess.DEVNULL, capture_output=True,
                          env={**os.environ, "LOCAL_RANK": "0"}, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")
