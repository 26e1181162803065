"""The state store against other processes and a real full disk: a store held by the sqlite3 shell
or by a second daemon is refused, naming the holder; a full disk (a small tmpfs) is StoreUnavailable
with nothing written; a store truncated beside the write-ahead log a killed writer left is refused
without touching the log. The same checks without processes: tests/unit/test_integrity.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from store_fixtures import make_store, refusal, spec, state_dir

from harness import small_tmpfs, sqlite3_holding
from spx.daemon.state import integrity
from spx.daemon.state.db import StoreUnavailable
from spx.daemon.state.store import Store


@pytest.fixture
def state(tmp_path) -> Path:
    return state_dir(tmp_path)


def test_a_store_locked_by_the_sqlite3_shell_is_refused_and_names_it(state):
    path = make_store(state)
    with sqlite3_holding(path) as shell:
        err = refusal(state)
        assert err.exit_code == 3
        assert f"state store {path} is locked by sqlite3 (pid {shell.pid})" in str(err)
    integrity.check_store(path, state / "backup")


def test_a_second_daemon_on_the_same_state_dir_is_refused(state):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from spx.daemon.state import integrity\n"
         "integrity.lock_state_dir(Path(sys.argv[1])); print('locked', flush=True); time.sleep(60)", str(state)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(integrity.StoreRefused) as err:
            integrity.lock_state_dir(state)
        assert f"another spx-trainer (pid {holder.pid}) is running on {state}" in str(err.value)
        assert err.value.exit_code == 3
    finally:
        holder.kill()
        holder.wait()
    os.close(integrity.lock_state_dir(state))  # the kernel let go of the dead holder's lock


@pytest.fixture
def small_fs(tmp_path) -> Iterator[Path]:
    # Room for a new store and its write-ahead log with some to spare: the test fills the rest itself.
    with small_tmpfs(tmp_path / "small", "4m") as mnt:
        yield mnt


def test_a_full_disk_is_store_unavailable_with_nothing_written(small_fs):
    store = Store(small_fs / "spx.sqlite")
    store.jobs.add(spec("first"), 0, "root", "/x/first.yaml", 1.0)
    filler = small_fs / "filler"
    with filler.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    big = {"env": {f"V{i}": "x" * 1000 for i in range(200)}}
    with pytest.raises(StoreUnavailable, match="database or disk is full"):
        for i in range(50):
            store.jobs.add(spec(f"big{i}", **big), 0, "root", f"/x/big{i}.yaml", 2.0)
    filler.unlink()
    names = [j.name for j in store.jobs.all()]
    assert names[0] == "first" and names == ["first"] + [f"big{i}" for i in range(len(names) - 1)]
    store.jobs.add(spec("after"), 0, "root", "/x/after.yaml", 3.0)  # space is back: writes work again
    assert store.jobs.by_name("after") is not None
    store.close()


def test_a_store_truncated_to_zero_beside_its_write_ahead_log_is_refused_without_touching_the_log(state):
    # A daemon killed before any checkpoint: the jobs are only in the WAL. SQLite would open the empty
    # main file as a new database and discard the log.
    code = ("import os, sys\nfrom pathlib import Path\nfrom spx.daemon.state.store import Store\n"
            "from spx.daemon.core.spec import JobSpec\ns = Store(Path(sys.argv[1]))\n"
            "s.db.conn.execute('PRAGMA wal_autocheckpoint=0')\n"
            "s.jobs.add(JobSpec.model_validate({'name': 'a', 'script': 'a.py'}), 0, 'r', 'f', 1.0)\nos._exit(9)\n")
    path = state / "spx.sqlite"
    subprocess.run([sys.executable, "-c", code, str(path)], check=False)
    wal = Path(f"{path}-wal")
    wal_bytes = wal.read_bytes()
    assert wal_bytes
    os.truncate(path, 0)
    err = refusal(state)
    assert f"is empty (0 bytes) beside a {len(wal_bytes)}-byte write-ahead log" in str(err)
    assert wal.read_bytes() == wal_bytes
