"""What `spx ls`, `spx status` and the job metrics say about a job, from the store and its heartbeat."""

from __future__ import annotations

import json
import time

from spx.daemon.cli import main
from spx.daemon.contract.worker_env import Heartbeat, write_heartbeat
from spx.daemon.core.config import load_config
from spx.daemon.core.spec import parse_spec
from spx.daemon.state.jobviews import heartbeat_path, job_view
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store


def test_a_beat_of_the_previous_attempt_does_not_count_as_the_jobs_step(tmp_path):
    """Attempt 1 reached step 26 and died; attempt 2 resumed from the step-20 checkpoint. Until
    attempt 2 beats, the job is at step 20 (steps 21–26 were lost), with no rate of its own."""
    store = Store(tmp_path / "s.sqlite")
    jid = store.jobs.add(parse_spec("name: a\nscript: a.py\n"), 0, "root", "/x", 1.0)
    store.jobs.transition(jid, JobState.STARTING, "starting", 2.0)
    a1 = store.attempts.start(jid, number=1, attempt_id="u1", now=10.0, resumed_from=None, resumed_from_step=None, port=1)
    store.jobs.transition(jid, JobState.RUNNING, "fresh start", 10.0)
    beat = tmp_path / "run"
    path = heartbeat_path(beat, store.jobs.get(jid))
    path.parent.mkdir(parents=True)
    write_heartbeat(path, Heartbeat(step=26, epoch=1, samples_per_second=70.0, last_checkpoint_step=20,
                                    last_checkpoint_time=50.0, time=60.0))
    view = job_view(store, store.jobs.get(jid), beat)
    assert (view.step, view.epoch, view.samples_per_second, view.last_checkpoint_step) == (26, 1, 70.0, 20)

    store.attempts.end(a1, end=61.0, exit_code=1, reason="exit code 1", reason_class="crash")
    store.jobs.transition(jid, JobState.RESTARTING, "exit code 1", 61.0)
    store.jobs.transition(jid, JobState.STARTING, "relaunching", 63.0)
    store.attempts.start(jid, number=2, attempt_id="u2", now=63.0, resumed_from="/c/step-000000020",
                        resumed_from_step=20, port=2)
    store.jobs.transition(jid, JobState.RUNNING, "resuming", 63.0)
    view = job_view(store, store.jobs.get(jid), beat)
    assert (view.step, view.epoch, view.samples_per_second, view.last_checkpoint_step) == (20, None, None, 20)
    assert view.last_checkpoint_time == 50.0  # still the time of the newest checkpoint

    write_heartbeat(path, Heartbeat(step=21, epoch=1, samples_per_second=75.0, last_checkpoint_step=20,
                                    last_checkpoint_time=50.0, time=70.0))
    view = job_view(store, store.jobs.get(jid), beat)
    assert (view.step, view.samples_per_second) == (21, 75.0)
    store.close()


def test_ls_shows_live_and_recent_jobs_and_ls_all_the_whole_history(tmp_path, capsys):
    """Read from the store directly (root's fallback while the daemon is down): the same views."""
    cfg = load_config(None, tmp_path / "root")
    cfg.store_path.parent.mkdir(parents=True)
    store = Store(cfg.store_path)
    now = time.time()
    for name, ended in (("last-month", now - 30 * 86400), ("an-hour-ago", now - 3600)):
        jid = store.jobs.add(parse_spec(f"name: {name}\nscript: a.py\n"), 0, "root", "/x", ended - 60)
        store.jobs.transition(jid, JobState.CANCELLED, "cancelled", ended)
    store.jobs.add(parse_spec("name: queued\nscript: a.py\n"), 0, "root", "/x", now)
    store.close()

    def ls(*flags: str) -> list[str]:
        assert main.main(["--root", str(tmp_path / "root"), "ls", "--json", *flags]) == 0
        return [j["name"] for j in json.loads(capsys.readouterr().out)]

    assert ls() == ["an-hour-ago", "queued"]
    assert ls("--all") == ["last-month", "an-hour-ago", "queued"]


def test_ls_shows_each_names_latest_job_and_ls_all_every_job_with_its_id(tmp_path, capsys):
    """As the README says: a reused name is one line in `spx ls` (its latest job, the one `spx status`
    and `spx logs` address); `spx ls --all` lists the earlier jobs too, told apart by job id."""
    cfg = load_config(None, tmp_path / "root")
    cfg.store_path.parent.mkdir(parents=True)
    store = Store(cfg.store_path)
    now = time.time()
    ids = []
    for ended in (now - 7200, now - 3600):
        jid = store.jobs.add(parse_spec("name: reused\nscript: a.py\n"), 0, "root", "/x", ended - 60)
        store.jobs.transition(jid, JobState.CANCELLED, "cancelled", ended)
        ids.append(jid)
    store.close()

    def ls(*flags: str) -> list[tuple[str, int]]:
        assert main.main(["--root", str(tmp_path / "root"), "ls", "--json", *flags]) == 0
        return [(j["name"], j["job_id"]) for j in json.loads(capsys.readouterr().out)]

    assert ls() == [("reused", ids[1])]
    assert ls("--all") == [("reused", ids[0]), ("reused", ids[1])]
    assert main.main(["--root", str(tmp_path / "root"), "ls", "--all"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["NAME", "JOB", "STATE"]
    assert [r.split()[:2] for r in table[1:-1]] == [["reused", str(ids[0])], ["reused", str(ids[1])]]
    assert table[-1] == "finished jobs are kept 30 days after they end (retention.finished_jobs_days), then removed"


def test_a_script_without_heartbeat_never_shows_an_old_checkpoint_as_the_newest(tmp_path, capsys):
    """A plain script (no trainer library) writes its own checkpoints and no heartbeat: the daemon
    knows only the step an attempt resumed from. Status says so, instead of "(no checkpoint)" or
    that old step as the checkpoint a cancel kept."""
    from spx.daemon.cli.render import print_status

    store = Store(tmp_path / "s.sqlite")
    jid = store.jobs.add(parse_spec("name: plain\nscript: a.py\n"), 0, "root", "/x", 1.0)
    store.jobs.transition(jid, JobState.STARTING, "starting", 2.0)
    store.attempts.start(jid, number=1, attempt_id="u1", now=3.0, resumed_from="/c/step-20", resumed_from_step=20, port=1)
    store.jobs.transition(jid, JobState.RUNNING, "resuming", 3.0)
    a = store.attempts.for_job(jid)[-1]
    store.attempts.end(a.id, end=9.0, exit_code=None, reason="cancelled by root", reason_class=None)
    store.jobs.transition(jid, JobState.CANCELLED, "cancelled by root", 9.0)
    view = job_view(store, store.jobs.get(jid), tmp_path / "run", with_history=True)
    assert not view.checkpoints_tracked and view.last_checkpoint_step == 20
    print_status(json.loads(json.dumps(view.to_json(with_history=True))))
    out = capsys.readouterr().out
    assert "last checkpoint >= 20 (no heartbeat: not tracked)" in out, out
    assert "(no checkpoint)" not in out and "checkpoint at step 20" not in out, out
    assert "its checkpoints are not tracked" in out, out
    store.close()
