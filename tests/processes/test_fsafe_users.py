"""as_user and attempt_files with real users: access is decided by the kernel for the owner with the
owner's groups, the user's tree is created as the user, and every odd thing at an attempt's paths
is contained (a reason, never a crash, never a file of root's touched)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
from accounts import uid_without_account
from hostile import probe
from hostile.users import hostile_users, run_as

from harness import wait_for
from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.spec import parse_spec
from spx.daemon.run import attempt_files
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.states import JobState
from spx.daemon.userfs import as_user, as_user_session
from spx.daemon.userfs.fsafe import UserPathError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates users and acts as them")


@pytest.fixture(scope="module")
def users():
    with hostile_users() as u:
        yield u


@pytest.fixture
def world():
    """A directory every test user can reach (tmp_path's parents are 0700)."""
    base = probe.world()
    yield base
    probe.remove_world(base)


def job_row(owner, name="j", job_id=7, extra="") -> JobRow:
    spec = parse_spec(f"name: {name}\nlauncher: python\nscript: x.py\ngpus: 0\n{extra}")
    return JobRow(id=job_id, name=name, state=JobState.STARTING, reason=None, owner_uid=owner.pw_uid,
                  owner=owner.pw_name, spec=spec, spec_file="", submitted=0.0, priority=0, gpus=[],
                  backoff_remaining=0.0, no_progress_streak=0, backoff_level=0, staging=None)


@pytest.fixture
def cfg(world):
    """A daemon's dirs under `world`; the owner's sessions an attempt's preparation kept are closed
    at the test's end (no process or thread outlives it)."""
    c = DaemonConfig.rooted(world / "root")
    for d in (c.log_dir, c.run_dir, c.checkpoints_root):
        d.mkdir(parents=True)
    (world / "root").chmod(0o755)
    yield c
    as_user.SESSIONS.close()


# --- as_user -------------------------------------------------------------------------------------


def test_access_is_decided_with_the_owners_supplementary_groups(users, world):
    owner, victim, group = users
    shared = world / "shared"
    shared.mkdir()
    os.chown(shared, 0, group.gr_gid)
    shared.chmod(0o750)
    private = Path(victim.pw_dir) / "private"
    private.mkdir(exist_ok=True)
    me = as_user.owner(owner.pw_uid)
    assert group.gr_gid in me.groups
    problems = as_user.check_access(me, [(str(shared), "read-tree"), (str(private), "enter-dir"),
                                         (str(world / "new" / "ckpt"), "write-or-create")])
    assert problems[0] is None, "a group member reads a group-readable tree"
    assert problems[1] and "cannot be reached (Permission denied)" in problems[1]
    assert problems[2] and "cannot be created" in problems[2]


def test_mkdirs_runs_as_the_owner_and_cannot_write_where_they_cannot(users, world):
    owner, _victim, _group = users
    me = as_user.owner(owner.pw_uid)
    mine = world / "mine"
    mine.mkdir()
    os.chown(mine, owner.pw_uid, owner.pw_gid)
    as_user.mkdirs(me, [str(mine / "a" / "b")])
    assert (mine / "a" / "b").stat().st_uid == owner.pw_uid
    with pytest.raises(UserPathError, match="Permission denied"):
        as_user.mkdirs(me, [str(world / "root-only" / "x")])
    assert not (world / "root-only").exists()


def test_checkpoint_discovery_skips_a_fifo_and_a_slow_one_times_out(users, world):
    owner, _victim, _group = users
    ckpt = world / "ckpt"
    ckpt.mkdir()
    os.mkfifo(ckpt / "checkpoint_epoch1_step9.pt")
    os.chown(ckpt, owner.pw_uid, owner.pw_gid)
    t0 = time.monotonic()
    found = as_user.find_latest(as_user.owner(owner.pw_uid), str(ckpt), None, 5.0)
    assert found["path"] is None and found["skipped"][0]["name"] == "checkpoint_epoch1_step9.pt"
    assert found["skipped"][0]["why"].startswith("not a regular file or directory")
    assert time.monotonic() - t0 < 5
    # Whatever still blocks (a hung mount) costs the timeout, not the daemon: the helper is killed.
    with pytest.raises(UserPathError, match="longer than"):
        as_user.find_latest(as_user.owner(owner.pw_uid), str(ckpt), None, 0.001)


@pytest.fixture
def sessions():
    """The daemon's kept sessions, closed at the test's end (no process or thread outlives it)."""
    yield as_user.SESSIONS
    as_user.SESSIONS.close()


def _session_pids() -> list[int]:
    with as_user.SESSIONS._lock:
        return [s.proc.pid for spare in as_user.SESSIONS._idle.values() for s in spare]


def _ended(pid: int) -> bool:
    try:
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True


def _uid_of(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("Uid:"))
    return int(line.split()[1])


def test_a_session_answers_every_call_in_one_process_of_the_owner(users, world, sessions):
    """The every-second work (a job's generation beat) costs a line on a pipe: twenty calls, one child,
    running as the owner, the same answers as a one-shot child's."""
    owner, victim, _group = users
    me = as_user.owner(owner.pw_uid)
    private = Path(victim.pw_dir) / "private"
    private.mkdir(exist_ok=True)
    args = {"checks": [{"path": str(world), "what": "enter-dir"}, {"path": str(private), "what": "enter-dir"}]}
    one_shot = as_user.run(me, "access", args, 10.0)
    assert one_shot[0] is None and "Permission denied" in one_shot[1]
    before = as_user.SESSIONS.started
    answers = [as_user.run(me, "access", args, 10.0, session=True) for _ in range(20)]
    assert answers == [one_shot] * 20
    assert as_user.SESSIONS.started == before + 1
    (pid,) = [p for p in _session_pids() if _uid_of(p) == owner.pw_uid]
    with pytest.raises(UserPathError, match="KeyError"):  # an action's failure is an answer, not the session's end
        as_user.run(me, "no-such-action", {}, 10.0, session=True)
    assert as_user.SESSIONS.started == before + 1 and pid in _session_pids()


def test_a_session_the_owner_stops_costs_one_timeout_and_one_they_kill_is_replaced(users, world, sessions):
    owner, _victim, _group = users
    me = as_user.owner(owner.pw_uid)
    args = {"checks": [{"path": str(world), "what": "enter-dir"}]}
    as_user.run(me, "access", args, 10.0, session=True)
    (pid,) = [p for p in _session_pids() if _uid_of(p) == owner.pw_uid]
    assert run_as(owner, ["kill", "-STOP", str(pid)]).returncode == 0  # the owner can: it is theirs
    t0 = time.monotonic()
    with pytest.raises(UserPathError, match="longer than 1 s"):
        as_user.run(me, "access", args, 1.0, session=True)
    assert time.monotonic() - t0 < 3
    wait_for(lambda: not Path(f'/proc/{pid}').exists(), 5, 'the session gone')  # killed with its group, not kept
    assert as_user.run(me, "access", args, 10.0, session=True) == [None]  # a fresh one
    (pid,) = [p for p in _session_pids() if _uid_of(p) == owner.pw_uid]
    assert run_as(owner, ["kill", "-KILL", str(pid)]).returncode == 0
    wait_for(lambda: _ended(pid), 5, "the session dead (a zombie until the pool looks at it)")
    started = as_user.SESSIONS.started
    assert as_user.run(me, "access", args, 10.0, session=True) == [None]  # a dead one is not taken
    assert as_user.SESSIONS.started == started + 1


def test_the_calls_of_one_preparation_share_one_process_released_at_its_end(users, world, sessions):
    """An attempt's preparation (attempt_prep.py): its checkpoint dir and discovery as the owner, in one
    process instead of one each, which `release` ends: nothing of ours is left running as the owner."""
    owner, _victim, _group = users
    me = as_user.owner(owner.pw_uid)
    (world / "prep").mkdir()
    os.chown(world / "prep", owner.pw_uid, owner.pw_gid)
    ckpt = world / "prep" / "ck"
    before, kept = as_user.SESSIONS.started, set(_session_pids())
    as_user.mkdirs(me, [str(ckpt)], 0o750, session=True)
    assert as_user.find_latest(me, str(ckpt), None, 10.0, session=True)["path"] is None
    (pid,) = set(_session_pids()) - kept
    assert ckpt.stat().st_uid == owner.pw_uid and _uid_of(pid) == owner.pw_uid, "made by that process, as the owner"
    assert as_user.SESSIONS.started == before + 1
    as_user.release(me)
    assert set(_session_pids()) == kept - {pid}
    wait_for(lambda: _ended(pid), 5, "the released session's end")


def test_an_idle_session_is_closed_and_its_process_ends(users, world):
    owner, _victim, _group = users
    clock = [100.0]
    kept = as_user_session.Sessions(as_user.SAFE_ENV, clock=lambda: clock[0])
    me = as_user.owner(owner.pw_uid)
    request = b'{"action": "access", "args": {"checks": []}}'
    assert kept.call(me.to_json(), me.name, "access", request, 10.0) == b'{"ok": true, "result": []}'
    pids = [s.proc.pid for spare in kept._idle.values() for s in spare]
    assert kept.sweep() == 1  # used just now: kept
    clock[0] += as_user_session.IDLE_SECONDS
    assert kept.sweep() == 0
    wait_for(lambda: not Path(f'/proc/{pids[0]}').exists(), 5, 'the session gone')
    kept.close()  # its sweeper thread ends


# --- attempt_files -------------------------------------------------------------------------------


def test_prepare_makes_root_log_dir_and_owner_dirs(users, cfg):
    owner, _v, _g = users
    files = attempt_files.prepare(cfg, job_row(owner), 1)
    st = os.lstat(files.log_dir)
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o755
    for d in (files.rank_log_dir, files.heartbeat_file.parent, files.checkpoint_dir):
        assert os.lstat(d).st_uid == owner.pw_uid, d
    assert stat.S_IMODE(os.lstat(files.rank_log_dir).st_mode) == 0o700, "the rank logs are the owner's alone"
    marker = os.lstat(files.log_dir / ".job-id")
    assert (marker.st_uid, stat.S_IMODE(marker.st_mode)) == (0, 0o600)
    attempt_files.note(files, "attempt 1 starts")
    log_st = os.lstat(files.log_file)
    assert (log_st.st_uid, stat.S_IMODE(log_st.st_mode)) == (owner.pw_uid, 0o600)
    assert files.log_file.read_text() == "spx: attempt 1 starts\n"
    assert attempt_files.read_log_tail(files, 7) == b"starts\n"
    assert run_as(owner, ["ln", "-s", "/etc/shadow", str(files.log_dir / "attempt-2.log")]).returncode != 0


def test_a_log_group_reads_the_logs_and_an_older_logs_mode_is_corrected(users, cfg):
    owner, victim, group = users
    files = attempt_files.prepare(cfg.model_copy(update={"log_group": group.gr_name}), job_row(owner), 1)
    assert files.readers.group_reads and files.readers.gid == group.gr_gid
    rank = os.lstat(files.rank_log_dir)
    assert (rank.st_uid, rank.st_gid, stat.S_IMODE(rank.st_mode)) == (owner.pw_uid, group.gr_gid, 0o750)
    files.log_file.write_text("older\n")
    os.chown(files.log_file, owner.pw_uid, victim.pw_gid)
    files.log_file.chmod(0o644)  # an older daemon's log: the owner's primary group and everyone read it
    attempt_files.note(files, "attempt 1 starts")
    st = os.lstat(files.log_file)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (owner.pw_uid, group.gr_gid, 0o640)
    assert files.log_file.read_text() == "older\nspx: attempt 1 starts\n"
    unset = attempt_files.paths(cfg.model_copy(update={"log_group": "spx-no-such-group"}), job_row(owner), 1)
    assert not unset.readers.group_reads and unset.readers.file_mode == 0o600, "no group: the owner alone"


def test_prepare_retires_a_reused_names_logs_and_survives_odd_markers(users, cfg):
    owner, _v, _g = users
    attempt_files.prepare(cfg, job_row(owner, job_id=3), 1)
    attempt_files.prepare(cfg, job_row(owner, job_id=4), 1)
    assert (cfg.log_dir / "j.job-3" / ".job-id").read_text() == "3\n"
    for odd in (b"../../etc\n", b"9" * 5000, b"\xff\xfe", b""):
        (cfg.log_dir / "j" / ".job-id").unlink()
        (cfg.log_dir / "j" / ".job-id").write_bytes(odd)
        attempt_files.prepare(cfg, job_row(owner, job_id=4), 1)
        assert (cfg.log_dir / "j" / ".job-id").read_text() == "4\n"
    (cfg.log_dir / "j" / ".job-id").unlink()
    os.mkfifo(cfg.log_dir / "j" / ".job-id")
    attempt_files.prepare(cfg, job_row(owner, job_id=4), 1)
    assert (cfg.log_dir / "j" / ".job-id").read_text() == "4\n"
    assert any(p.name.startswith("j.job-unknown-") for p in cfg.log_dir.iterdir())


def test_a_user_owned_log_dir_is_moved_aside_not_used(users, cfg):
    owner, _v, _g = users
    secret = cfg.log_dir.parent / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    before = os.stat(secret)
    planted = cfg.log_dir / "j"
    planted.mkdir()
    os.chown(planted, owner.pw_uid, owner.pw_gid)
    assert run_as(owner, ["ln", "-s", str(secret), str(planted / "attempt-1.log")]).returncode == 0
    files = attempt_files.prepare(cfg, job_row(owner), 1)
    attempt_files.note(files, "header")
    after = os.stat(secret)
    assert (after.st_uid, after.st_mode, after.st_mtime_ns) == (before.st_uid, before.st_mode, before.st_mtime_ns)
    assert secret.read_text() == "root only\n"
    assert os.lstat(files.log_dir).st_uid == 0 and not files.log_file.is_symlink()


@pytest.mark.parametrize("kind", ["fifo", "symlink", "huge", "garbage", "dir", "wrong-types"])
def test_an_odd_heartbeat_is_none_never_a_wait_or_a_leak(users, cfg, kind):
    owner, _v, _g = users
    files = attempt_files.prepare(cfg, job_row(owner), 1)
    hb = files.heartbeat_file
    secret = cfg.log_dir.parent / "secret.json"
    secret.write_text('{"step": 424242, "time": 1}')
    secret.chmod(0o600)
    make = {
        "fifo": lambda: os.mkfifo(hb),
        "symlink": lambda: os.symlink(secret, hb),
        "huge": lambda: hb.write_bytes(b'{"step": 1, "pad": "' + b"x" * 200_000 + b'"}'),
        "garbage": lambda: hb.write_bytes(b"\x00\xff not json"),
        "dir": lambda: hb.mkdir(),
        "wrong-types": lambda: hb.write_text('{"step": "1", "time": "now"}'),
    }
    make[kind]()
    t0 = time.monotonic()
    assert attempt_files.read_heartbeat(hb) is None
    assert time.monotonic() - t0 < 1.0


def test_checkpoint_dir_is_created_as_the_user_and_refused_where_they_cannot(users, cfg, world):
    owner, victim, _g = users
    mine = world / "home-like"
    mine.mkdir()
    os.chown(mine, owner.pw_uid, owner.pw_gid)
    files = attempt_files.prepare(cfg, job_row(owner, extra=f"checkpoints: {{dir: {mine}/ck/a}}\n"), 1)
    assert os.lstat(files.checkpoint_dir).st_uid == owner.pw_uid
    theirs = Path(victim.pw_dir) / "ck"
    with pytest.raises(UserPathError, match="Permission denied"):
        attempt_files.prepare(cfg, job_row(owner, extra=f"checkpoints: {{dir: {theirs}}}\n"), 1)
    assert not theirs.exists()


def test_latest_checkpoint_is_found_as_the_owner(users, cfg):
    owner, _v, _g = users
    job = job_row(owner, extra="checkpoints: {pattern: 'ckpt-*.pt'}\n")
    files = attempt_files.prepare(cfg, job, 1)
    import zipfile

    for step in (5, 12):
        with zipfile.ZipFile(files.checkpoint_dir / f"ckpt-{step}.pt", "w") as z:
            z.writestr("data", "x")
    ref, found = attempt_files.latest_checkpoint(job, files, 10)
    assert ref is not None and ref.step == 12 and ref.path.name == "ckpt-12.pt"
    assert found["layout"] == "pattern-file" and found["path"] == str(ref.path)


def test_prepare_for_an_owner_without_an_account_raises_the_reason(users, cfg):
    owner, _v, _g = users
    free = uid_without_account()
    gone = job_row(owner)
    gone = JobRow(**{**gone.__dict__, "owner_uid": free})
    with pytest.raises(UserPathError, match="no account"):
        attempt_files.prepare(cfg, gone, 1)
