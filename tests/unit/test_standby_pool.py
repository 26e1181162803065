"""run/standby_pool.py: at most one launcher ahead per job, taken by its attempt only if it fits the
attempt's plan, discarded (without waiting) otherwise; a standby that could not start is not retried
for that attempt. Standbys here are stand-ins that record what is done to them (run/standby.py's own
tests start real ones)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from spx.daemon.core.config import load_config
from spx.daemon.core.spec import parse_spec
from spx.daemon.run.launcher import LaunchPlan
from spx.daemon.run.standby_pool import StandbyPool
from spx.daemon.state.store import Store


@dataclass
class StandIn:
    number: int
    attempt_id: str
    fitting: bool = True
    discarded: bool = False
    cgroup: None = None
    devices: None = None  # no device filter here (tests/integration/test_device_filter.py has them)

    def fits(self, plan: LaunchPlan) -> bool:
        return self.fitting

    def discard(self) -> None:
        self.discarded = True


PLAN = LaunchPlan(["python", "-m", "torch.distributed.run"], {}, "/")


@pytest.fixture
def pool(tmp_path):
    cfg = load_config(None, tmp_path / "root")
    store = Store(tmp_path / "spx.sqlite")
    job = store.jobs.get(store.jobs.add(parse_spec("name: p\nscript: /bin/true\nlauncher: torchrun\n"), 54321, "u",
                                  "/spool/p", 1.0))
    yield StandbyPool(cfg, store, None), job
    store.close()


def test_the_attempt_it_was_started_for_takes_a_fitting_standby_as_its_own(pool):
    p, job = pool
    ready = p.standbys[job.id] = StandIn(2, "tag-2")
    assert p.attempt_id(job.id, 2) == "tag-2" and p.attempt_id(job.id, 3) is None
    assert p.take(job.id, 2, "tag-2", PLAN) is ready and job.id not in p.standbys and not ready.discarded
    assert p.children() == set(), "taken: no longer the pool's"


@pytest.mark.parametrize("number, tag, fitting", [(3, "tag-2", True), (2, "other", True), (2, "tag-2", False)])
def test_a_standby_for_another_attempt_or_that_does_not_fit_is_discarded_and_the_attempt_launches_cold(
        pool, number, tag, fitting):
    p, job = pool
    ready = p.standbys[job.id] = StandIn(2, "tag-2", fitting)
    assert p.take(job.id, number, tag, PLAN) is None
    assert ready.discarded and job.id not in p.standbys


def test_a_standby_that_cannot_start_is_not_tried_again_for_that_attempt(pool):
    p, job = pool  # its owner, uid 54321, has no account: nothing can start as them
    p.start(job, (0,), 1)
    assert job.id not in p.standbys
    p.standbys[job.id] = StandIn(5, "tag-5")
    p.start(job, (0,), 1)  # asked again for the attempt it refused: the one for 5 goes, none is started
    assert job.id not in p.standbys


def test_forgetting_a_job_discards_its_standby(pool):
    p, job = pool
    ready = p.standbys[job.id] = StandIn(4, "tag-4")
    p.forget(job.id)
    assert ready.discarded and p.standbys == {}
