"""Which launches get a standby launcher, started ahead (standby.module_of): pure, no processes. The
standby itself, with real processes: tests/processes/test_standby_live.py."""

from __future__ import annotations

import sys

from spx.daemon.run import standby
from spx.daemon.run.launcher import LaunchPlan


def test_only_a_launcher_of_its_own_gets_a_standby():
    assert standby.module_of(LaunchPlan([sys.executable, "-m", "torch.distributed.run", "x.py"], {}, "/")) \
        == "torch.distributed.run"
    assert standby.module_of(LaunchPlan([sys.executable, "-m", "deepspeed.launcher.launch"], {}, "/")) \
        == "deepspeed.launcher.launch"
    assert standby.module_of(LaunchPlan([sys.executable, "train.py"], {}, "/")) is None, "a python job runs job code"
    assert standby.module_of(LaunchPlan([sys.executable, "-m", "mypkg.train"], {}, "/")) is None
