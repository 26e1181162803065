"""Standby workers on real GPUs: workers started ahead with no GPU visible (torch, torch._dynamo and
spx.trainer imported while CUDA_VISIBLE_DEVICES is empty) see exactly the plan's GPUs once handed
their ranks, and NCCL works across them — nothing imported ahead settled CUDA on no device.

    bash tests/run.sh tests/gpu/test_gpu_standby_workers.py -rs
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from harness import wait_for
from spx.daemon.run import launcher, proctree, standby
from spx.daemon.run.launcher import LaunchPlan, free_port

SCRIPT = """
import sys
preimported = "torch._dynamo" in sys.modules
import json, os
import torch
import torch.distributed as dist
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl")
total = torch.tensor([float(dist.get_rank() + 1)], device="cuda")
dist.all_reduce(total)
json.dump({"preimported": preimported, "count": torch.cuda.device_count(), "total": total.item(),
           "cvd": os.environ["CUDA_VISIBLE_DEVICES"]},
          open(os.path.join(os.environ["OUT"], f"rank{dist.get_rank()}.json"), "w"))
dist.destroy_process_group()
"""


def test_standby_workers_see_the_plans_gpus_and_run_nccl(tmp_path, cuda_torch):
    world = min(cuda_torch["count"], 2)
    gpus = ",".join(str(cuda_torch["count"] - world + i) for i in range(world))  # the last ones: not 0.. by luck
    (tmp_path / "train.py").write_text(SCRIPT)
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={world}",
            "--master-addr=127.0.0.1", f"--master-port={free_port()}", "--max-restarts=0", "--tee=3",
            f"--log-dir={tmp_path / 'ranks'}", str(tmp_path / "train.py")]
    env = {"PATH": f"{Path(sys.executable).parent}:{launcher.SAFE_PATH}", "SPX_ATTEMPT_ID": "gpu-sw",
           "OUT": str(tmp_path), "HOME": str(tmp_path), "CUDA_VISIBLE_DEVICES": gpus, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    plan = LaunchPlan(argv=argv, env=env, cwd=str(tmp_path))
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ready = standby.start(2, "gpu-sw", plan, os.getuid(), fd, "attempt-2.log", None, 1 << 22, workers=world)
    finally:
        os.close(fd)
    assert ready is not None
    try:
        def waiting() -> bool:  # every standby worker blocked reading its command: imports done
            found = [p for p in proctree.attempt_pids("gpu-sw")
                     if "standby_worker.py" in Path(f"/proc/{p}/cmdline").read_text()
                     and Path(f"/proc/{p}/syscall").read_text().startswith("0 0x0 ")]
            return len(found) == world
        wait_for(waiting, 180, "the standby workers' imports")
        spawned = ready.go(plan)
        assert spawned.proc.wait(timeout=300) == 0, (tmp_path / "attempt-2.log").read_text()[-4000:]
        spawned.relay.wait(timeout=30)
    finally:
        ready.discard()
    for rank in range(world):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["preimported"], "ran in the standby worker, not a cold interpreter"
        assert seen["count"] == world and seen["cvd"] == gpus, seen
        assert seen["total"] == world * (world + 1) / 2
