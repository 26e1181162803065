"""The first error of an attempt, read from a log this venv's torchrun really wrote (2 gloo workers,
one raising): whatever prefixes its version writes, the worker's exception is found. The same
reading on captured logs: tests/unit/test_rootcause.py."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from spx.daemon.run.rootcause import find_root_cause


def _log_in_job_dir(tmp_path):
    """log/NAME/attempt-1.log, as the daemon lays it out (the read walks from log/)."""
    job_dir = tmp_path / "log" / "job"
    job_dir.mkdir(parents=True)
    return job_dir / "attempt-1.log"


FAILING_SCRIPT = """\
import time
import torch.distributed as dist

class InjectedCrash(Exception):
    pass

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    raise InjectedCrash("injected crash at step 25")
time.sleep(60)
"""


@pytest.mark.slow
def test_a_log_written_by_this_venvs_torchrun_yields_the_workers_exception(tmp_path):
    """The log as the daemon's launcher makes it (torchrun --tee=3, gloo, 2 workers), from the real
    torchrun of this venv, whatever prefixes its version writes."""
    import torch

    (tmp_path / "fail.py").write_text(FAILING_SCRIPT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = _log_in_job_dir(tmp_path)
    with log.open("wb") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
             "--master-addr=127.0.0.1", f"--master-port={port}", "--max-restarts=0", "--tee=3",
             f"--log-dir={tmp_path / 'ranks'}", "fail.py"],
            cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, timeout=120, check=False)
    assert proc.returncode != 0
    found = find_root_cause(log)
    assert found is not None and found.startswith("rank 0 (pid "), (torch.__version__, log.read_text()[-3000:])
    assert "exited with code 1: InjectedCrash: injected crash at step 25 (user-code)" in found, (torch.__version__, found)
