"""Incidents (run/incident.py, run/incidents.py, state/incidents_table.py, state/incident_views.py):
a failed attempt's end gives one incident with its GPUs' XIDs, kernel lines and readings of the
minute before, a hang's stacks, and its recovery from the attempts' phases; stored bounded, with
the job, and gone with it. A real store; a fake clock; the owner's lane scripted (runs at once)."""

from __future__ import annotations

import sqlite3
import time

import pytest

from spx.daemon.cli import incidents as cli_incidents
from spx.daemon.core.causes import ReasonClass
from spx.daemon.core.lanes import Outcome
from spx.daemon.core.spec import parse_spec
from spx.daemon.gpu.backend import GpuDevice
from spx.daemon.gpu.kernel_log import KernelLines
from spx.daemon.gpu.recent import RecentReadings
from spx.daemon.lifecycle.actions import FinishAttempt
from spx.daemon.run import incident as I
from spx.daemon.run.incidents import GpuSources, Incidents
from spx.daemon.state import incident_views, schema
from spx.daemon.state.incidents_table import MAX_PER_JOB, IncidentTooLarge
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store

BASE = time.time()  # the fake clock runs near now: the kernel log's times are monotonic, compared with wall time
DEVICES = [GpuDevice(i, f"GPU-{i:04d}", "NVIDIA H100 80GB HBM3", 80 << 30, f"00000000:{0x18 + i:02X}:00.0", i)
           for i in range(8)]


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class ScriptedLane:
    """The owner's lane, run at once on the caller's thread: what was submitted, and its answer."""

    def __init__(self) -> None:
        self.kinds: list[tuple[str, bool]] = []

    def submit(self, job, kind, work, deadline, done, action=None, keep=False):
        self.kinds.append((kind, keep))
        try:
            outcome = Outcome(value=work())
        except Exception as e:  # noqa: BLE001 — as the lanes answer
            outcome = Outcome(error=e)
        done(outcome)


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "spx.sqlite")
    yield s
    s.close()


def add_job(store: Store, name: str) -> int:
    job_id = store.jobs.add(parse_spec(f"name: {name}\nscript: a.py\ngpus: 4\n"), 1000, "alice", "/x", BASE)
    return job_id


def test_an_xid_under_a_4_gpu_job_gives_an_incident_with_the_gpu_the_xid_the_minute_before_and_the_kernel_line(
        store, tmp_path):
    clock = Clock(BASE)
    recent = RecentReadings(clock)
    for step in range(25):  # a scrape every 5 s for two minutes, on every GPU of the job
        clock.t = BASE + 5 * step
        for g in (0, 1, 2, 3):
            recent.record(g, {"utilization": 0.9, "power_watts": 600.0 + step})
    clock.t = BASE + 118.0
    recent.xid(2, 79)
    offset = time.time() - time.monotonic()
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(f"3,7,{int((BASE + 118.0 - offset) * 1e6)},-;NVRM: Xid (PCI:0000:1a:00): 79, pid=77, "
                    "name=python, GPU has fallen off the bus.\n"
                    f"3,8,{int((BASE + 118.0 - offset) * 1e6)},-;NVRM: Xid (PCI:0000:1f:00): 13, not this job's GPU\n")
    job_id = add_job(store, "four")
    job = store.jobs.get(job_id)
    lane = ScriptedLane()
    recorder = Incidents(store, lane, GpuSources(recent, lambda: DEVICES, str(kmsg)), clock)  # type: ignore[arg-type]
    clock.t = BASE + 118.5
    recorder.stop_began(job_id, 1, "gpu-fault")
    clock.t = BASE + 125.0
    recorder.failed(job, FinishAttempt(1, JobState.RESTARTING, "gpu-fault: XID 79 on GPU 2 (GPU fell off the bus)",
                                       ReasonClass.GPU_FAULT, exit_code=None, signal=15, ended_wall=BASE + 124.0),
                    (0, 1, 2, 3), None, BASE)
    assert lane.kinds == [("incident", True)]
    (row,) = store.incidents.for_jobs([job_id])
    doc = row.doc
    assert (row.attempt, row.reason_class, row.time) == (1, "gpu-fault", BASE + 118.5)
    assert doc["failed_at"] == BASE + 118.5 and doc["stop_cause"] == "gpu-fault" and doc["signal"] == 15
    assert [g["index"] for g in doc["gpus"]] == [0, 1, 2, 3]
    gpu2 = doc["gpus"][2]
    assert gpu2["uuid"] == "GPU-0002" and gpu2["pci_bus_id"] == "00000000:1A:00.0"
    assert gpu2["xids"] == [{"time": BASE + 118.0, "xid": 79, "what": "XID 79 on GPU 2 (GPU fell off the bus)"}]
    assert gpu2["kernel"] == ["NVRM: Xid (PCI:0000:1a:00): 79, pid=77, name=python, GPU has fallen off the bus."]
    assert all(g["kernel"] == [] and g["xids"] == [] for g in doc["gpus"] if g["index"] != 2)
    # The minute before the failure: scrapes at +60 … +115 s (12 of them), none after it.
    times = [r["time"] - BASE for r in gpu2["readings"]]
    assert times == [60.0 + 5 * i for i in range(12)]
    assert gpu2["readings"][-1]["power_watts"] == 623.0
    assert doc["stacks"] is None and doc["kernel_log"] == {"unavailable": None, "truncated": False}


def test_no_incident_for_an_end_that_is_no_failure_and_the_crash_time_is_the_launchers_exit(store):
    clock = Clock(BASE + 50)
    job_id = add_job(store, "j")
    job = store.jobs.get(job_id)
    lane = ScriptedLane()
    recorder = Incidents(store, lane, GpuSources(RecentReadings(clock), lambda: DEVICES, "/nonexistent"), clock)  # type: ignore[arg-type]
    recorder.stop_began(job_id, 1, "cancel")
    recorder.failed(job, FinishAttempt(1, JobState.CANCELLED, "cancelled by alice", ReasonClass.CANCELLED), (0,),
                    None, BASE)
    recorder.failed(job, FinishAttempt(2, JobState.SUCCEEDED, "exit 0", None), (0,), None, BASE)
    assert lane.kinds == [] and store.incidents.for_jobs([job_id]) == []
    root = "rank 1 (pid 123) exited with code 1: ValueError: bad batch (user-code)"
    recorder.failed(job, FinishAttempt(3, JobState.RESTARTING, "exit 1", ReasonClass.USER_CODE, exit_code=1,
                                       root_cause=root, ended_wall=BASE + 40), (0,), None, BASE)
    (row,) = store.incidents.for_jobs([job_id])
    assert row.doc["failed_at"] == BASE + 40 and row.doc["first_rank"] == 1 and row.doc["root_cause"] == root
    assert row.doc["kernel_log"]["unavailable"].startswith("/nonexistent")
    assert row.doc["gpus"][0]["readings"] == []  # nothing scraped: said as no readings, not invented


LOG_OF_A_HANG = b"""step 10
spx: hang detected: no heartbeat, GPUs idle and log silent for 8 s
spx: hang detected; stack of pid 4242:
spx: Process 4242: python quiet.py
spx: Thread 4242 (idle): "MainThread"
spx:     <module> (quiet.py:3)
[default0]: still here
spx: hang detected; stack of pid 4243:
spx: Thread 4243 (idle): "MainThread"
spx:     wait (threading.py:320)
spx: hang: no progress for 8 s; SIGTERM, 5 s grace to checkpoint
spx: after the kill
"""


def test_a_hangs_stacks_are_the_dumps_noted_in_the_log_without_the_workers_lines():
    stacks = I.stacks_in_log(LOG_OF_A_HANG)
    assert stacks == ("hang detected; stack of pid 4242:\nProcess 4242: python quiet.py\n"
                      "Thread 4242 (idle): \"MainThread\"\n    <module> (quiet.py:3)\n"
                      "hang detected; stack of pid 4243:\nThread 4243 (idle): \"MainThread\"\n"
                      "    wait (threading.py:320)")
    assert I.stacks_in_log(b"spx: nothing hung\nworker line\n") is None
    huge = b"spx: hang detected; stack of pid 1:\n" + b"".join(b"spx: frame %d\n" % i for i in range(20000))
    cut = I.stacks_in_log(huge)
    assert cut is not None and len(cut) == I.MAX_STACK_CHARS and cut.endswith("frame 19999")


def test_a_hang_incident_carries_the_stacks_read_from_the_attempt_log(store, monkeypatch):
    clock = Clock(BASE + 30)
    job_id = add_job(store, "quiet")
    monkeypatch.setattr("spx.daemon.run.attempt_files.read_log_tail", lambda files, n: LOG_OF_A_HANG)
    recorder = Incidents(store, ScriptedLane(), GpuSources(RecentReadings(clock), lambda: DEVICES, "/nonexistent"), clock)  # type: ignore[arg-type]
    recorder.stop_began(job_id, 1, "hang")
    recorder.failed(store.jobs.get(job_id), FinishAttempt(1, JobState.RESTARTING, "hang", ReasonClass.HANG),
                    (0,), object(), BASE)  # type: ignore[arg-type]
    (row,) = store.incidents.for_jobs([job_id])
    assert "stack of pid 4242" in row.doc["stacks"] and "quiet.py:3" in row.doc["stacks"]
    assert row.doc["stop_cause"] == "hang"


def test_fit_drops_the_oldest_readings_first_then_the_stacks_beginning():
    gpu = I.GpuIdentity(0, "GPU-0", "00000000:18:00.0")
    failure = I.Failure(1, 100.0, 101.0, "hang", None, None, 9, "hang", (gpu,))
    readings = {0: [{"time": float(t), "utilization": 1.0} for t in range(I.MAX_READINGS + 10)]}
    doc = I.assemble(failure, readings, {}, KernelLines(), "s" * 40000)
    assert len(doc["gpus"][0]["readings"]) == I.MAX_READINGS  # the newest
    fitted = I.fit(doc, 20000)
    assert len(str(fitted)) < 25000 and fitted["gpus"][0]["readings"] == [] and fitted["stacks"].startswith("…")
    doc = I.fit(I.assemble(failure, {0: [{"time": float(t)} for t in range(50)]}, {}, KernelLines(), None), 600)
    kept = doc["gpus"][0]["readings"]
    assert kept and kept[-1]["time"] == 49.0 and kept[0]["time"] > 0  # the oldest went


def test_the_store_keeps_a_jobs_latest_incidents_refuses_an_oversized_one_and_removes_them_with_the_job(store):
    job_id, other = add_job(store, "a"), add_job(store, "b")
    for attempt in range(1, MAX_PER_JOB + 6):
        store.incidents.add(job_id, attempt, BASE + attempt, "crash", {"failed_at": BASE + attempt})
    store.incidents.add(other, 1, BASE, "oom", {"failed_at": BASE})
    store.incidents.add(other, 1, BASE, "oom", {"failed_at": BASE, "again": True})  # the same attempt: replaced
    kept = store.incidents.for_jobs([job_id])
    assert [r.attempt for r in kept] == list(range(6, MAX_PER_JOB + 6))
    assert [r.doc for r in store.incidents.for_jobs([other])] == [{"failed_at": BASE, "again": True}]
    with pytest.raises(IncidentTooLarge):
        store.incidents.add(other, 2, BASE, "oom", {"x": "y" * 300_000})
    with store.db.write(None) as db:  # however a job is removed (retention), its incidents go with it
        db.execute("DELETE FROM events WHERE job_id = ?", (job_id,))
        db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
    assert store.incidents.for_jobs([job_id]) == [] and len(store.incidents.for_jobs([other])) == 1
    assert store.incidents.job_ids() == [other]


def test_a_version_3_store_gets_the_incidents_table_and_its_trigger(tmp_path):
    path = tmp_path / "v3.sqlite"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("DROP TRIGGER incidents_go_with_the_job")
    db.execute("DROP TABLE incidents")
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()
    Store(path).close()
    db = sqlite3.connect(path)
    names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'trigger')")}
    assert {"incidents", "incidents_go_with_the_job"} <= names
    assert db.execute("PRAGMA user_version").fetchone()[0] == schema.VERSION
    db.close()


def test_the_view_adds_the_recovery_phases_and_the_restart_seconds_to_the_next_first_step(store):
    job_id = add_job(store, "four")
    first = store.attempts.start(job_id, number=1, attempt_id="a1", now=BASE, resumed_from=None,
                                 resumed_from_step=None, port=None)
    store.attempts.add_phases(first, {"spawn": BASE, "launcher_exit": BASE + 101.0, "failure_seen": BASE + 101.2,
                                      "group_dead": BASE + 101.5, "end_recorded": BASE + 101.6})
    store.incidents.add(job_id, 1, BASE + 100.0, "gpu-fault", {"failed_at": BASE + 100.0, "gpus": []})
    view = incident_views.visible(store, "four", lambda job: True)
    assert view is not None and view[0]["restart_seconds"] is None  # no next attempt yet
    second = store.attempts.start(job_id, number=2, attempt_id="a2", now=BASE + 103, resumed_from=None,
                                  resumed_from_step=None, port=None)
    store.attempts.add_phases(second, {"placed": BASE + 102.5, "spawn": BASE + 103.0, "first_step": BASE + 112.25})
    (incident,) = incident_views.visible(store, "four", lambda job: True) or []
    assert [(p["attempt"], p["phase"]) for p in incident["recovery"]] == [
        (1, "launcher_exit"), (1, "failure_seen"), (1, "group_dead"), (1, "end_recorded"),
        (2, "placed"), (2, "spawn"), (2, "first_step")]
    assert incident["restart_seconds"] == 12.25 and incident["restart_seconds_from"] == "phases"
    assert incident["job"] == "four" and incident["class"] == "gpu-fault" and incident["attempt"] == 1
    assert incident_views.visible(store, "four", lambda job: False) is None  # another user's: no such job
    assert incident_views.visible(store, None, lambda job: False) == []
    text = "\n".join(cli_incidents.render(incident))
    assert "four  attempt 1  gpu-fault" in text and "restart:     12.25 s" in text and "first_step +12.25 s" in text


def test_an_incident_that_cannot_be_gathered_leaves_the_recorded_end_alone(store):
    clock = Clock(BASE)
    job_id = add_job(store, "j")

    def no_devices():
        raise RuntimeError("NVML went away")

    recorder = Incidents(store, ScriptedLane(), GpuSources(RecentReadings(clock), no_devices, "/nonexistent"), clock)  # type: ignore[arg-type]
    recorder.failed(store.jobs.get(job_id), FinishAttempt(1, JobState.FAILED, "exit 1", ReasonClass.CRASH, exit_code=1),
                    (0,), None, BASE)  # does not raise
    assert store.incidents.for_jobs([job_id]) == []


def test_retention_removing_a_finished_job_removes_its_incidents(store):
    job_id, live = add_job(store, "old"), add_job(store, "live")
    store.jobs.transition(job_id, JobState.FAILED, "exit 1", BASE + 10)
    for j in (job_id, live):
        store.incidents.add(j, 1, BASE, "crash", {"failed_at": BASE})
    assert store.housekeeping.remove_finished([job_id, live]) == [job_id]  # a live job is never removed
    assert store.incidents.job_ids() == [live]
