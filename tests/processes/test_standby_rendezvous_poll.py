"""The standby agent's quicker rendezvous (run/standby_agent.py): a torchrun across hosts looks for
the other agents every 0.1 s instead of torch's second — both the sleep between looks and the
state holder's cache — more slowly the more hosts share the store, and torch's other delays stay
as they are. The patch runs in a child interpreter, so this process's torch stays untouched."""

from __future__ import annotations

import subprocess
import sys

import pytest

from spx.daemon.run.standby_agent import rendezvous_poll_seconds

pytest.importorskip("torch")

PROBE = """
import time
from spx.daemon.run import standby_agent
import torch.distributed.elastic.rendezvous.dynamic_rendezvous as dr
slept = []
time.sleep = slept.append
dr._delay(seconds=1)
standby_agent.quicker_rendezvous(0.1)
dr._delay(seconds=1)
dr._delay(seconds=0.5)
dr._delay(seconds=(0.2, 0.2))
holder = dr._BackendRendezvousStateHolder(backend=None, settings=None)
print(slept, holder._cache_duration)
"""


def test_the_one_second_poll_and_cache_become_a_tenth_and_the_rest_stays_torchs():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[1, 0.1, 0.5, 0.2] 0.1"


@pytest.mark.parametrize(("argv", "poll"), [
    (["--nnodes=2", "--nproc-per-node=2"], 0.1),
    (["--nnodes", "8"], 0.1),
    (["--nnodes=1:40"], 0.5),
    (["--nnodes=400"], 1.0),
    (["--nnodes=1"], None),
    (["--nnodes=two"], None),
    (["--nproc-per-node=2"], None),
])
def test_the_pace_slows_with_the_hosts_that_share_the_store(argv, poll):
    assert rendezvous_poll_seconds(["python", "-m", "torch.distributed.run", *argv, "train.py"]) == poll
