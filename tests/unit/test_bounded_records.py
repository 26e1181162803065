"""Every record a job's user can write, read through core.bounded (issue 25): the heartbeat, `.spx/lease`,
`.spx/state`, `.spx/job.yaml`, `.spx-gang/`, the attempt's exit record and `.job-id` marker, the
checkpoint files discovery judges.

Property, per record: for ANY bytes in the file (JSON-ish documents with hostile numbers, nesting
bombs, raw bytes, splices), its reader returns a valid record — every number in range — or raises the
one Garbage type (or says "none", where the reader never raises); nothing else. Examples: the cases
the issue found, and where the reason reaches the user (`spx status`, the adopt scan). No processes,
no sleeps: files in a temporary directory.
"""

from __future__ import annotations

import getpass
import json
import math
import os
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_bounded import DOCUMENTS, FUZZ, JSONISH

from spx.daemon.cli import render
from spx.daemon.contract import checkpoint_discovery, checkpoint_formats, checkpoint_layout
from spx.daemon.contract.worker_env import WORKER_PHASES, Heartbeat, load_heartbeat, parse_heartbeat
from spx.daemon.core import bounded
from spx.daemon.core.bounded import Garbage
from spx.daemon.core.spec import parse_spec
from spx.daemon.exporter.job_collector import JobCollector
from spx.daemon.intake import adopt, adopt_scan, job_record
from spx.daemon.run import attempt_files, gang, launcher
from spx.daemon.state.jobviews import heartbeat_path, job_view
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store
from spx.daemon.userfs import gang_dir
from spx.daemon.userfs import heartbeat as heartbeat_reader

UID = "0123456789abcdef0123456789abcdef"
MAX = bounded.MAX_WHOLE
FILES = settings(FUZZ, max_examples=100)  # each example writes (and the gang's fsyncs) a file
# A valid record of each kind, the seed the properties mutate.
LEASE = {"host": "m:/s", "job": UID, "expires": 1700000060.0, "written": 1700000000.0}
END_MARKER = {"job": UID, "state": "succeeded", "reason": "exit code 0", "host": "m:/s", "time": 1700000000.0}
GENERATION = {"gen": 3, "host": "m:/s", "label": "node1", "time": 999.0, "reason": "exit code 1", "counted": True,
              "not_before": 1005.0, "final": None}
HOST_LINE = {"host": "m:/t", "label": "node2", "gen": 3, "state": "running", "time": 998.0, "step": 40}
EXIT_RECORD = {"attempt_id": UID, "launched": True, "exit_code": 1, "signal": None, "stop_signal": None,
               "end": 1700000000.0}


@pytest.fixture(scope="module")
def scratch():
    """One directory for a property's examples (hypothesis reruns a test body, not a tmp_path)."""
    with tempfile.TemporaryDirectory(prefix="spx-bounded-") as d:
        yield Path(d)


def _record_shaped(valid: dict[str, object]) -> st.SearchStrategy[bytes]:
    """A valid record with some fields replaced by any JSON-ish text (hostile numbers, nesting,
    wrong types), dropped, or added: most are refused, some still read."""
    change = st.one_of(st.none(), JSONISH, st.just("drop"))
    edits = st.dictionaries(st.sampled_from([*valid, "extra"]), change, max_size=3)

    def render(edit: dict[str, str | None]) -> bytes:
        fields = {k: json.dumps(v) for k, v in valid.items()}
        for k, v in edit.items():
            if v == "drop":
                fields.pop(k, None)
            elif v is not None:
                fields[k] = v
        return ("{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in fields.items()) + "}").encode()

    return edits.map(render)


def _in_range(x: object, lo: float, hi: float) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and lo <= x <= hi


# --- the heartbeat ------------------------------------------------------------------------------------

BEAT = {"step": 120, "epoch": 1, "samples_per_second": 80.5, "last_checkpoint_step": 100,
        "last_checkpoint_time": 1700000000.0, "status": "running", "time": 1700000010.0,
        "phases": {"first_step": 1700000001.0}, "node_rank": 1, "nnodes": 2, "ranks": [2, 3]}


def valid_beat(beat: Heartbeat) -> None:
    assert type(beat.step) is int and 0 <= beat.step <= MAX
    assert type(beat.epoch) is int and 0 <= beat.epoch <= MAX
    assert _in_range(beat.samples_per_second, 0, MAX) and _in_range(beat.time, 0, bounded.MAX_TIME)
    assert beat.last_checkpoint_step is None or (type(beat.last_checkpoint_step) is int and 0 <= beat.last_checkpoint_step <= MAX)
    assert beat.last_checkpoint_time is None or _in_range(beat.last_checkpoint_time, 0, bounded.MAX_TIME)
    assert isinstance(beat.status, str) and len(beat.status) <= 64
    assert beat.phases is None or all(k in WORKER_PHASES and _in_range(v, 0, bounded.MAX_TIME) for k, v in beat.phases.items())
    assert beat.nnodes is None or (type(beat.nnodes) is int and 1 <= beat.nnodes <= MAX)
    assert beat.node_rank is None or (type(beat.node_rank) is int and 0 <= beat.node_rank < (beat.nnodes or MAX + 1))
    assert beat.ranks is None or (len(beat.ranks) == 2 and all(type(r) is int for r in beat.ranks)
                                  and 0 <= beat.ranks[0] <= beat.ranks[1] <= MAX)
    float(beat.step), json.dumps(beat.phases, allow_nan=False)  # what /metrics and the store do with it


@FUZZ
@given(st.one_of(DOCUMENTS, _record_shaped(BEAT)))
def test_a_heartbeat_is_valid_or_garbage(raw):
    try:
        beat = load_heartbeat(raw)
    except Garbage as e:
        assert e.what == "heartbeat" and e.detail
        assert parse_heartbeat(raw) is None
        return
    valid_beat(beat)


@FILES
@given(st.one_of(DOCUMENTS, _record_shaped(BEAT)))
def test_the_daemons_heartbeat_read_never_raises(scratch, raw):
    path = scratch / "jobs" / "1-j" / "heartbeat.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)
    found = heartbeat_reader.read(path)
    assert (found.beat is None) != (found.problem is None)
    if found.beat is not None:
        valid_beat(found.beat)


def test_a_step_of_10_to_the_400_is_garbage_with_its_reason():
    with pytest.raises(Garbage) as e:
        load_heartbeat(json.dumps({"step": 10**400, "time": 1.0}))
    assert str(e.value) == "heartbeat: step 1" + "0" * 35 + "… (401 digits) is not a whole number in [0, 2**53 - 1]"


def test_a_step_of_2_to_the_63_is_garbage_before_it_reaches_sqlite():
    with pytest.raises(Garbage, match=r"^heartbeat: step 9223372036854775808 is not a whole number"):
        load_heartbeat(json.dumps({"step": 2**63, "time": 1.0}))


@pytest.mark.parametrize("phase", ["1e400", "1" + "0" * 400, "NaN", "-Infinity", '"soon"', "1e300"])
def test_an_odd_phase_is_dropped_and_the_beat_still_counts(phase):
    beat = load_heartbeat(f'{{"step": 3, "time": 100.0, "phases": {{"first_step": {phase}, "rendezvous": 90.5}}}}')
    assert beat.step == 3 and beat.phases == {"rendezvous": 90.5}


@pytest.mark.parametrize("stall", ["1e400", "-1", "NaN", '"long"', "1e300"])
def test_an_odd_checkpoint_stall_is_dropped_and_the_beat_still_counts(stall):
    beat = load_heartbeat(f'{{"step": 3, "time": 100.0, "checkpoint_stall_seconds": {stall}}}')
    assert beat.step == 3 and beat.checkpoint_stall_seconds is None
    assert load_heartbeat('{"step": 3, "time": 100.0, "checkpoint_stall_seconds": 12.5}').checkpoint_stall_seconds == 12.5


def _running_job(tmp_path: Path) -> tuple[Store, int, Path]:
    store = Store(tmp_path / "s.sqlite")
    jid = store.jobs.add(parse_spec("name: j\nscript: a.py\n"), 1000, "alice", "/x", 1.0)
    store.jobs.transition(jid, JobState.STARTING, "starting", 2.0, gpus=[0])
    store.attempts.start(jid, number=1, attempt_id="u1", now=3.0, resumed_from=None, resumed_from_step=None, port=1)
    store.jobs.transition(jid, JobState.RUNNING, "fresh start", 3.0)
    run_dir = tmp_path / "run"
    heartbeat_path(run_dir, store.jobs.get(jid)).parent.mkdir(parents=True)
    return store, jid, run_dir


def test_a_garbage_heartbeat_is_shown_in_status_and_ls_and_metrics_keep_answering(tmp_path, capsys):
    store, jid, run_dir = _running_job(tmp_path)
    heartbeat_path(run_dir, store.jobs.get(jid)).write_text(
        '{"step": ' + "1" + "0" * 400 + ', "time": 10.0, "phases": {"first_step": 1e400}}')
    view = job_view(store, store.jobs.get(jid), run_dir, with_history=True)
    assert view.step is None and view.state == "running"
    assert view.heartbeat_problem == "step 1" + "0" * 35 + "… (401 digits) is not a whole number in [0, 2**53 - 1]"
    metrics, ok = JobCollector(lambda: [view]).collect()
    assert ok and any(m.name == "spx_job_state" for m in metrics)
    render.print_status(json.loads(json.dumps(view.to_json(with_history=True))))
    assert "heartbeat unreadable: step 1000" in capsys.readouterr().out

    heartbeat_path(run_dir, store.jobs.get(jid)).write_text('{"step": 12, "time": 10.0}')
    view = job_view(store, store.jobs.get(jid), run_dir)
    assert (view.step, view.heartbeat_problem) == (12, None)
    store.close()


# --- the store's side: an attempt's end is never refused for a number ------------------------------------


def test_an_end_with_a_step_sqlite_cannot_hold_still_ends_the_job(tmp_path):
    """Were a 2**63 step to reach the store, the end record must not be refused: the job would stay
    `running` here, holding its GPUs, while given up in memory."""
    store, jid, _run_dir = _running_job(tmp_path)
    row = store.attempts.open_for(jid).id
    store.attempts.finish(jid, row, JobState.FAILED, "daemon error: x", 9.0,
                         {"end": 9.0, "exit_code": None, "reason": "daemon error: x", "reason_class": "daemon-error",
                          "max_step": 2**63}, {"gpus": []})
    job, (attempt,) = store.jobs.get(jid), store.attempts.for_job(jid)
    assert (job.state, job.gpus, attempt.end, attempt.max_step) == (JobState.FAILED, [], 9.0, None)
    assert store.attempts.open_for(jid) is None
    store.close()


# --- .spx/lease and .spx/state ----------------------------------------------------------------------------


@FUZZ
@given(st.one_of(DOCUMENTS, _record_shaped(LEASE)))
def test_a_lease_is_valid_or_garbage(raw):
    try:
        lease = job_record.lease_of(raw)
    except Garbage as e:
        assert e.what == ".spx/lease" and e.detail
        return
    assert lease is not None and isinstance(lease["host"], str) and _in_range(lease["expires"], 0, bounded.MAX_TIME)
    assert job_record.lease_until(lease)  # time.gmtime takes it
    adopt._held(lease)


@FUZZ
@given(st.one_of(DOCUMENTS, _record_shaped(END_MARKER)))
def test_an_end_marker_is_valid_or_garbage(raw):
    try:
        ended = job_record.ended_state(raw, UID)
    except Garbage as e:
        assert e.what == ".spx/state" and e.detail
        return
    assert ended is None or ended in job_record.TERMINAL_STATES


def test_a_lease_expiring_in_1e300_is_garbage_and_never_formatted():
    with pytest.raises(Garbage, match=r"^\.spx/lease: expires 1e\+300 is not a number this daemon computes with"):
        job_record.lease_of(json.dumps({"host": "h", "job": UID, "expires": 1e300}).encode())
    assert job_record.lease_until({"host": "h", "expires": 1e300}) == "an unknown time"
    assert job_record.lease_until({"host": "h", "expires": 10**400}) == "an unknown time"
    assert job_record.lease_until({"host": "h", "expires": 0}) == "1970-01-01T00:00:00Z"


def test_the_helpers_lease_reader_takes_garbage_for_nobodys():
    """As the owner, a lease that is no lease is an expired one (userfs/spx_dir.py): 1e300 included."""
    from spx.daemon.userfs import cas, spx_dir

    def lease(raw: bytes) -> dict | None:  # as the compare-and-swap reads it, then judges it
        return spx_dir._lease_doc(cas._record(raw).doc)

    assert lease(json.dumps({"host": "h", "expires": 1e300}).encode()) is None
    assert lease(b"[" * 4000) is None
    assert lease(json.dumps({"host": "h", "expires": 5.0}).encode())["expires"] == 5.0


def test_an_end_marker_of_4000_brackets_is_garbage():
    with pytest.raises(Garbage, match=r"^\.spx/state: nested deeper than 32 levels$"):
        job_record.ended_state(b"[" * 4000, UID)


def _checkpoint_dir(root: Path, name: str, lease: bytes | None = None, state: bytes | None = None) -> Path:
    ckpt = root / name
    (ckpt / ".spx").mkdir(parents=True)
    os.chmod(ckpt / ".spx", 0o700)
    record = (f'uid: "{UID}"\nformat: 1\nname: {name}\nowner: {getpass.getuser()}\nsubmitted: 1700000000.5\n'
              f'host: "m:/var/lib/spx"\nspec:\n  name: {name}\n  script: /tmp/train.py\n')
    (ckpt / ".spx" / "job.yaml").write_text(record)
    os.chmod(ckpt / ".spx" / "job.yaml", 0o600)
    for fname, content in (("lease", lease), ("state", state)):
        if content is not None:
            (ckpt / ".spx" / fname).write_bytes(content)
    return ckpt


def test_the_adopt_scan_refuses_a_garbage_lease_or_end_marker_with_the_reason_and_adopts_the_rest(tmp_path):
    _checkpoint_dir(tmp_path, "lease1e300", lease=json.dumps({"host": "h", "job": UID, "expires": 1e300}).encode())
    _checkpoint_dir(tmp_path, "state4000", state=b"[" * 4000)
    _checkpoint_dir(tmp_path, "fine", lease=json.dumps({"host": "h", "job": UID, "expires": 5.0}).encode())
    found = {r.dir.name: r for r in adopt_scan.scan(tmp_path)}
    assert isinstance(found["lease1e300"], adopt_scan.Refused)
    assert found["lease1e300"].why.startswith(".spx/lease: expires 1e+300 is not a number this daemon computes with")
    assert isinstance(found["state4000"], adopt_scan.Refused)
    assert found["state4000"].why.startswith(".spx/state: nested deeper than 32 levels")
    assert isinstance(found["fine"], adopt_scan.Found) and found["fine"].lease["expires"] == 5.0


# --- .spx/job.yaml ------------------------------------------------------------------------------------------

RECORD = (f'uid: "{UID}"\nformat: 1\nname: j\nowner: alice\nowner_uid: 1000\nsubmitted: 1700000000.5\n'
          'host: "m:/var/lib/spx"\nspec:\n  name: j\n  script: /tmp/train.py\n  restart: {max_restarts: 3}\n')
YAML_NUMBERS = ["1e400", ".inf", ".nan", "-.inf", "9" * 30, "9" * 5000, str(2**63), str(2**53), "true", "[1, [2]]",
                "{a: 1}", "[" * 4000, "&a 1", "*a", "!!python/name:os.system", "'x'", "~"]


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 10_000), st.one_of(st.sampled_from(YAML_NUMBERS), st.binary(max_size=6).map(
    lambda b: b.decode("latin-1")))), min_size=1, max_size=4))
def test_a_job_record_is_valid_or_garbage(edits):
    """Mutations of a valid record: a value replaced by a hostile one, or bytes spliced in."""
    lines = RECORD.split("\n")
    for at, payload in edits:
        i = at % len(lines)
        key, sep, _value = lines[i].partition(": ")
        lines[i] = f"{key}{sep}{payload}" if sep else lines[i] + payload
    raw = "\n".join(lines).encode("utf-8", "surrogateescape")
    try:
        record = job_record.parse(raw)
    except Garbage as e:
        assert isinstance(e, job_record.RecordError) and e.what == ".spx/job.yaml" and e.detail
        return
    assert _in_range(record.submitted, 1, bounded.MAX_TIME) and record.uid == UID
    assert all(abs(n) <= 2**63 - 1 for n in (record.spec.restart.max_restarts, record.spec.gpus or 0))


def test_a_job_record_submitted_at_infinity_is_refused_with_the_reason():
    with pytest.raises(job_record.RecordError, match=r"^\.spx/job\.yaml: submitted inf is not a number in \[1, 1e\+11\]"):
        job_record.parse(RECORD.replace("submitted: 1700000000.5", "submitted: .inf").encode())
    assert job_record.parse(RECORD.encode()).submitted == 1700000000.5


# --- .spx-gang/ ----------------------------------------------------------------------------------------------


@FILES
@given(st.one_of(DOCUMENTS, _record_shaped(GENERATION)),
       st.one_of(DOCUMENTS, _record_shaped(HOST_LINE)))
def test_the_gang_files_are_read_as_a_generation_or_garbage_never_an_exception(scratch, generation, line):
    d = scratch / "gang"
    hosts = d / ".spx-gang" / "hosts"
    hosts.mkdir(parents=True, exist_ok=True)
    (d / ".spx-gang" / "generation").write_bytes(generation)
    (hosts / ("f" * 16)).write_bytes(line)
    answer = gang_dir.beat({"host": "machine:0", "key": "0" * 16, "label": "node0", "now": 1000.0, "dir": str(d),
                            "gen": 0, "step": 5})
    assert type(answer["current"]["gen"]) is int and 0 <= answer["current"]["gen"] <= MAX
    reply = bounded.parse_json(json.dumps(answer).encode(), "the answer of gang_beat", max_bytes=1 << 20)
    turn = gang.turn_of(reply["current"], 1000.0)
    assert turn is None or (0 <= turn.gen <= MAX and math.isfinite(turn.delay))
    for h in reply["hosts"]:
        shown = gang.host_line(h)
        assert shown["time"] is None or math.isfinite(shown["time"])


# --- the attempt's exit record and log dir marker (root's files, read bounded all the same) --------------------


@FILES
@given(st.one_of(DOCUMENTS, _record_shaped(EXIT_RECORD)))
def test_an_exit_record_is_valid_or_none(scratch, raw):
    (scratch / "attempt-1.exit").write_bytes(raw)
    record = launcher.recorded_exit(scratch, "attempt-1.log", UID)
    if record is not None:
        assert record.exit_code is None or 0 <= record.exit_code <= 255
        assert record.signal is None or 0 <= record.signal <= 127
        assert record.ended is None or _in_range(record.ended, 0, bounded.MAX_TIME)


def test_an_exit_record_is_read_when_well_formed():
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "attempt-1.exit").write_text(json.dumps({"attempt_id": UID, "launched": True, "exit_code": 3,
                                                            "signal": None, "stop_signal": None, "end": 12.5}))
        assert launcher.recorded_exit(Path(d), "attempt-1.log", UID) == launcher.ExitRecord(True, 3, None, False, 12.5)
        (Path(d) / "attempt-1.exit").write_text(json.dumps({"attempt_id": UID, "exit_code": 2**63, "end": 1.0}))
        assert launcher.recorded_exit(Path(d), "attempt-1.log", UID) is None


@FILES
@given(st.binary(max_size=64))
def test_the_log_dirs_job_id_marker_is_a_job_id_or_none(scratch, raw):
    (scratch / attempt_files.MARKER).write_bytes(raw)
    fd = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
    try:
        marker = attempt_files.read_marker(fd)
    finally:
        os.close(fd)
    assert marker is None or 1 <= marker <= MAX


def test_a_marker_past_int64_is_no_job_id(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for raw, expected in ((b"9999999999999999999\n", None), (b"42\n", 42), (b"0\n", None)):
            (tmp_path / attempt_files.MARKER).write_bytes(raw)
            assert attempt_files.read_marker(fd) == expected
    finally:
        os.close(fd)


# --- what checkpoint discovery reads in the user's tree (as the user) -------------------------------------------


def test_a_step_past_2_to_the_53_in_a_name_orders_but_is_not_reported(tmp_path):
    for name in ("run-12", "run-" + "9" * 30):
        (tmp_path / name).mkdir()
        (tmp_path / name / "data.txt").write_text("x")
    found = checkpoint_discovery.discover(tmp_path, "run-*")
    assert found.chosen is not None and found.chosen.name == "run-" + "9" * 30 and found.chosen.step is None
    assert found.older[0].step == 12
    bounded.parse_json(json.dumps(found.to_json()), "the answer of find_latest")  # the daemon can read it


def test_checkpoint_json_too_deep_is_a_reason_and_odd_numbers_do_not_matter(tmp_path):
    (tmp_path / "trainer_state.json").write_text("[" * 4000)
    with pytest.raises(ValueError, match="deeper than 32"):
        checkpoint_formats.read_json(tmp_path / "trainer_state.json")
    (tmp_path / "trainer_state.json").write_text('{"total_flos": 1.2e18, "log_history": [{"loss": NaN}]}')
    assert isinstance(checkpoint_formats.read_json(tmp_path / "trainer_state.json"), dict)
    ckpt = tmp_path / "step-000000001"
    ckpt.mkdir()
    (ckpt / checkpoint_layout.MANIFEST).write_text("[" * 4000)
    assert checkpoint_layout.read_manifest(ckpt) is None
    (ckpt / checkpoint_layout.MANIFEST).write_text(json.dumps({"step": 10**400, "files": []}))
    assert checkpoint_layout.read_manifest(ckpt) is None
    (ckpt / checkpoint_layout.MANIFEST).write_text(json.dumps({"step": 1, "files": [], "time": time.time()}))
    assert checkpoint_layout.read_manifest(ckpt) is not None
