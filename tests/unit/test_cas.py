"""The one compare-and-swap (userfs/cas.py) and the fence it gives workers (contract/fencing.py), on a
real directory, in one process (flock conflicts between two open files of one process as between
two processes; the race of many processes is tests/integration/test_lease_race.py)."""

from __future__ import annotations

import json
import os

import pytest
from lease_fixtures import leased_dir

from spx.daemon.contract.fencing import Fence, Fenced
from spx.daemon.contract.worker_env import ENV_CHECKPOINT_DIR, ENV_FENCE
from spx.daemon.userfs import cas, spx_dir

STRANGER = 54321  # a uid nobody on the test host is (root's tests chown to it)


@pytest.fixture
def spx(tmp_path):
    d = tmp_path / ".spx"
    d.mkdir(mode=0o700)
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    yield d, fd
    os.close(fd)


def test_a_write_moves_the_generation_on_or_keeps_it(spx):
    d, fd = spx
    with cas.Locked(fd, "lock") as lk:
        assert lk.read("rec") == cas.Record(None, 0)
        assert lk.write("rec", {"host": "a"}, bump=True) == {"host": "a", "gen": 1}
    with cas.Locked(fd, "lock") as lk:
        assert lk.read("rec").gen == 1
        assert lk.write("rec", {"host": "a", "renewed": True}, bump=False)["gen"] == 1
        assert lk.write("rec", {"host": "b"}, bump=True, floor=6)["gen"] == 7, "at least one past the floor"
    assert json.loads((d / "rec").read_text()) == {"host": "b", "gen": 7}
    assert (d / "lock").read_text() == "7\n", "the lock file keeps the highest generation handed out"


def test_a_record_removed_and_written_again_never_repeats_a_generation(spx):
    d, fd = spx
    with cas.Locked(fd, "lock") as lk:
        lk.read("rec")
        lk.write("rec", {"host": "a"}, bump=True)
        lk.write("rec", {"host": "a"}, bump=True)
        lk.remove("rec")
    assert not (d / "rec").exists()
    (d / "rec").write_text("garbage, or a record some user rewrote with a lower gen")
    with cas.Locked(fd, "lock") as lk:
        assert lk.read("rec") == cas.Record(None, 0)
        assert lk.write("rec", {"host": "b"}, bump=True)["gen"] == 3


def test_while_one_holds_the_lock_no_other_swap_gets_in(spx):
    _d, fd = spx
    with cas.Locked(fd, "lock"), pytest.raises(TimeoutError, match="stayed locked"):
        cas.Locked(fd, "lock", wait=0).__enter__()
    with cas.Locked(fd, "lock", wait=0) as lk:  # released: free again at once
        assert lk.read("rec").doc is None


def test_a_lock_file_or_record_of_another_user_is_not_private(spx):
    d, fd = spx
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    (d / "lock").write_text("")
    os.chown(d / "lock", STRANGER, STRANGER)
    with pytest.raises(cas.NotPrivate, match="belongs to uid 54321"):
        cas.Locked(fd, "lock").__enter__()
    (d / "rec").write_text("{}")
    os.chown(d / "rec", STRANGER, STRANGER)
    with pytest.raises(cas.NotPrivate):
        cas.read_regular(fd, "rec")


def test_a_spx_dir_others_may_write_or_another_user_made_is_refused_and_left_as_it_is(tmp_path):
    ckpt = tmp_path / "ckpt"
    (ckpt / ".spx").mkdir(parents=True, mode=0o700)
    (ckpt / ".spx").chmod(0o770)
    lease = {"host": "a", "job": "0" * 32, "expires": 1e12, "written": 1.0}
    with pytest.raises(cas.NotPrivate, match="writable by others than its owner"):
        spx_dir.publish({"dir": str(ckpt), "record": "uid: x\n", "lease": lease, "now": 1.0})
    if os.geteuid() == 0:
        (ckpt / ".spx").chmod(0o700)
        os.chown(ckpt / ".spx", STRANGER, STRANGER)
        with pytest.raises(cas.NotPrivate, match="belongs to uid 54321"):
            spx_dir.publish({"dir": str(ckpt), "record": "uid: x\n", "lease": lease, "now": 1.0})
    assert os.listdir(ckpt / ".spx") == [], "nothing written into it, nothing repaired"


# --- the fence --------------------------------------------------------------------------------------


def test_the_fence_holds_while_the_lease_is_at_its_generation_and_keeps_breakers_out(tmp_path):
    ckpt = leased_dir(tmp_path, 4)
    fence = Fence.from_env({ENV_FENCE: "4", ENV_CHECKPOINT_DIR: str(ckpt)})
    assert fence == Fence(ckpt, 4)
    fd = os.open(ckpt / ".spx", os.O_RDONLY | os.O_DIRECTORY)
    try:
        with fence.held(wait=0), pytest.raises(TimeoutError):  # a daemon taking the lease waits for the publish
            cas.Locked(fd, "lease.lock", wait=0).__enter__()
        with cas.Locked(fd, "lease.lock", wait=0) as lk:
            lk.read("lease")
            lk.write("lease", {"host": "b", "job": "j", "expires": 1e12}, bump=True)
    finally:
        os.close(fd)
    with pytest.raises(Fenced, match="launched with lease generation 4, the lease .* is at generation 5"), \
            fence.held(wait=0):
        raise AssertionError("published under a lease another host took")


def test_the_fence_fails_closed_without_a_lease_or_with_one_another_user_planted(tmp_path):
    ckpt = leased_dir(tmp_path, 2)
    (ckpt / ".spx" / "lease").unlink()
    with pytest.raises(Fenced, match="no lease"), Fence(ckpt, 2).held(wait=0):
        pass
    with pytest.raises(Fenced, match="cannot be verified"), Fence(tmp_path / "elsewhere", 2).held(wait=0):
        pass
    ckpt2 = leased_dir(tmp_path / "b", 2)
    (ckpt2 / ".spx").chmod(0o777)
    with pytest.raises(Fenced, match="writable by others"), Fence(ckpt2, 2).held(wait=0):
        pass


def test_no_fence_without_the_variable_and_a_garbled_token_matches_nothing(tmp_path):
    assert Fence.from_env({ENV_CHECKPOINT_DIR: str(tmp_path)}) is None
    assert Fence.from_env({ENV_FENCE: "seven", ENV_CHECKPOINT_DIR: str(tmp_path)}) == Fence(tmp_path, -1)
