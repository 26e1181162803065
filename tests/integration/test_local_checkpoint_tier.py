"""The local checkpoint tier under the real daemon: each job gets a host-RAM dir (root-owned base,
the job's own dir 0700) as SPX_LOCAL_CHECKPOINT_DIR; its checkpoints appear there and in the
persistent dir; a relaunch on this host resumes from the local copy, and from the persistent copy
when the local dir is gone (as after a host loss); the dir is removed when the job ends.

One job, three attempts: attempt 1 crashes at step 25 (every rank raises: no JIT) → attempt 2 resumes
from the local step 20; rank 1 of attempt 2 is kill -9'd → the survivor's JIT checkpoint goes to
both tiers; the local dir is emptied in the backoff → attempt 3 resumes from the persistent copy of
that JIT checkpoint."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import uuid
from pathlib import Path

import pytest

from harness import EXAMPLES, Daemon, job_pids, wait_for
from spx.daemon.contract import checkpoint_layout as layout

pytestmark = pytest.mark.slow
PY = sys.executable


def rank1_pid(name: str) -> int | None:
    for pid in job_pids(name):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"RANK=1" in env and b"LOCAL_RANK=1" in env:
            return pid
    return None


def test_checkpoints_in_both_tiers_resume_local_then_persistent_and_the_local_dir_goes_with_the_job(tmp_path):
    local_root = Path("/dev/shm") / f"spx-test-{uuid.uuid4().hex[:8]}"
    d = Daemon(tmp_path / "root", gpu_backend="fake", config={"local_checkpoint_root": str(local_root)}).start()
    try:
        argv = ", ".join(f'"{a}"' for a in ("--batch_size", "4", "--model-size", "tiny", "--seed", "7", "--steps", "45",
                                             "--checkpoint-every", "10", "--crash-at-step", "25",
                                             "--sleep-per-step", "0.2"))
        d.drop("tier.yaml", f"name: tier\nlauncher: torchrun\nscript: {EXAMPLES / 'train_ddp.py'}\npython: {PY}\n"
                            f"args: [{argv}]\ngpus: 2\nprocs: 2\n"
                            "restart: {max_restarts: 3, backoff_seconds: [2, 5]}\nstop: {grace_seconds: 30}\n")
        persistent = d.checkpoint_dir("tier")
        wait_for(lambda: list(local_root.glob("tier.*")), 120, "the job's local dir")
        (local,) = local_root.glob("tier.*")
        base, mine = os.stat(local_root), os.stat(local)
        assert base.st_uid == 0 and stat.S_IMODE(base.st_mode) == 0o755
        assert stat.S_IMODE(mine.st_mode) == 0o700 and mine.st_uid == os.getuid()

        def attempt2_step() -> int:  # rank 1's last completed step, from its JIT boundary files in the local dir
            steps = [int(f.name.split(".step-")[1][:9]) for f in local.glob(".spx-boundary-*/rank-00001.step-*.pt")]
            return max(steps, default=0) if max(steps, default=0) > 21 and d.job("tier")["attempts"] >= 2 else 0

        wait_for(lambda: attempt2_step() > 21, 240, "attempt 2 training", interval=0.02)
        # Killed first, the checks after: on a loaded host they take seconds, and a kill that lands on
        # step 30 finds its JIT checkpoint already written as the periodic one.
        victim = wait_for(lambda: rank1_pid("tier"), 30, "rank 1 of attempt 2", interval=0.02)
        os.kill(victim, signal.SIGKILL)
        st = d.status("tier")
        assert st["history"][1]["resumed_from"] == str(local / "step-000000020"), st["history"]
        # Replicated as well: by attempt 1 unless torchrun stopped rank 0 while it copied, else by
        # attempt 2 as it resumed from the local copy.
        wait_for(lambda: layout.read_manifest(persistent / "step-000000020"), 30, "step 20 in the persistent dir")
        jit = wait_for(lambda: next((r for r in layout.complete_checkpoints(persistent)
                                     if r.step % 10 and (layout.read_manifest(r.path) or {}).get("extra", {}).get("jit")),
                                    None), 180, "the JIT checkpoint's replica in the persistent dir")
        assert layout.read_manifest(local / jit.path.name) is not None, "the JIT checkpoint is in the local tier too"
        # The host "loses" its RAM before the daemon looks for attempt 3's checkpoint (it does so only
        # after the launcher exited and the backoff passed).
        for entry in local.iterdir():
            shutil.rmtree(entry, ignore_errors=True)
        assert not layout.complete_checkpoints(local)

        d.wait_state("tier", {"succeeded", "failed"}, 300)
        st = d.status("tier")
        assert st["state"] == "succeeded", st
        third = st["history"][2]
        assert third["resumed_from"] == str(jit.path) and third["resumed_from_step"] == jit.step, st["history"]
        wait_for(lambda: not local.exists(), 30, "the local dir removed when the job ended")
        assert [r.step for r in layout.complete_checkpoints(persistent)][-1] == 45
    finally:
        d.stop()
        shutil.rmtree(local_root, ignore_errors=True)
