"""At start, the run package ends a job whose accepted spec this version refuses (run/invalid_specs.py);
the store only says which ones and why."""

import json

from spx.daemon.core.spec import parse_spec
from spx.daemon.run.invalid_specs import fail_invalid_specs
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store


def spec(name):
    return parse_spec(f"name: {name}\nscript: a.py\n")


def test_a_stored_spec_this_version_refuses_fails_its_job_at_start_instead_of_every_read(tmp_path):
    """An upgrade that tightens a bound (here: hang timeout past 30 days, once accepted) must not
    make each read of the store raise: the job ends failed with the reason, the rest go on; one with
    an attempt still running is left for the supervisor to adopt."""
    store = Store(tmp_path / "s.sqlite")
    bad = store.jobs.add(spec("old"), 0, "root", "/x", 1.0)
    good = store.jobs.add(spec("new"), 0, "root", "/y", 1.0)
    running = store.jobs.add(spec("running"), 0, "root", "/z", 1.0)
    store.jobs.transition(running, JobState.STARTING, "GPUs allocated", 1.5)
    row = store.attempts.start(running, number=1, attempt_id="u1", now=1.5, resumed_from=None,
                               resumed_from_step=None, port=1)
    store.attempts.running(running, row, pgid=4242, boot_id="b", start_ticks=1, reason="fresh", now=1.5)
    raw = spec("old").model_dump(mode="json", by_alias=True)
    raw["restart"]["hang_timeout_seconds"] = 1e12
    for job_id in (bad, running):
        raw["name"] = store.jobs.get(job_id).name
        store.db.conn.execute("UPDATE jobs SET spec_json = ? WHERE id = ?", (json.dumps(raw), job_id))
    assert {j.name for j in store.jobs.live_with_invalid_spec()} == {"old", "running"}
    assert "restart.hang_timeout_seconds" in (store.jobs.get(bad).spec_problem or "")
    failed = fail_invalid_specs(store, 2.0)
    assert [j.id for j in failed] == [bad]
    old = store.jobs.get(bad)
    assert old.state is JobState.FAILED and "restart.hang_timeout_seconds" in (old.reason or "")
    assert [j.id for j in store.jobs.live()] == [good, running]
    assert fail_invalid_specs(store, 3.0) == []
    store.close()
