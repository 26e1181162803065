"""What a job's standby holds in memory (state/standby_memory.py), and where it is shown: the job's
view, `spx status`, its gauge and the host's. The processes are a /proc written in tmp_path, and the
test process itself as the one real process read (tests/unit starts none)."""

from __future__ import annotations

import os
from pathlib import Path

from spx.daemon.cli.render import print_status
from spx.daemon.core.spec import parse_spec
from spx.daemon.exporter.host_collector import HostCollector
from spx.daemon.exporter.job_collector import JobCollector
from spx.daemon.gpu.backend import open_backend
from spx.daemon.state import standby_memory
from spx.daemon.state.jobviews import job_view
from spx.daemon.state.ledger_view import HostAccount
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store
from spx.daemon.state.views import JobView

KIB = 1024


def a_process(proc: Path, pid: int, pss_kib: int | None, children: tuple[int, ...] = ()) -> None:
    """`pid` in the /proc at `proc`: its smaps_rollup (empty for a zombie: `pss_kib` None) and its
    children, split across two threads as the kernel lists them."""
    (proc / str(pid) / "task" / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "task" / f"{pid}1").mkdir()
    rollup = "" if pss_kib is None else (
        f"00400000-7fff00000000 ---p 00000000 00:00 0 [rollup]\nRss: {pss_kib * 3} kB\nPss: {pss_kib} kB\n"
        f"Pss_Anon: {pss_kib // 2} kB\n")
    (proc / str(pid) / "smaps_rollup").write_text(rollup)
    half = len(children) // 2
    (proc / str(pid) / "task" / str(pid) / "children").write_text("".join(f"{c} " for c in children[:half]))
    (proc / str(pid) / "task" / f"{pid}1" / "children").write_text("".join(f"{c} " for c in children[half:]))


def test_a_standby_is_its_processes_and_their_descendants_by_pss(tmp_path):
    """Monitor 10 → agent 11 → a child 13 and a zombie 12; the relay 20: Pss summed, not Rss, each
    process once; the zombie adds nothing."""
    a_process(tmp_path, 10, 3000, (11,))
    a_process(tmp_path, 11, 200_000, (12, 13))
    a_process(tmp_path, 12, None)
    a_process(tmp_path, 13, 500)
    a_process(tmp_path, 20, 2000)
    assert standby_memory.tree_bytes([10, 20], tmp_path) == (3000 + 200_000 + 500 + 2000) * KIB
    assert standby_memory.tree_bytes([11], tmp_path) == 200_500 * KIB


def test_processes_gone_since_the_snapshot_are_no_figure_not_an_error(tmp_path):
    a_process(tmp_path, 20, 2000, (21,))  # its child 21 ended between the listing and the read
    assert standby_memory.tree_bytes([10], tmp_path) is None, "the standby was taken or discarded"
    assert standby_memory.tree_bytes([], tmp_path) is None, "no standby"
    assert standby_memory.tree_bytes([10, 20], tmp_path) == 2000 * KIB, "what is left is counted"
    a_process(tmp_path, 30, None)
    assert standby_memory.tree_bytes([30], tmp_path) is None, "a zombie holds no memory"
    (tmp_path / "40").mkdir()  # its directory, but the process ended before its files were read
    assert standby_memory.tree_bytes([40], tmp_path) is None
    assert standby_memory.children(40, tmp_path) == []


def test_a_standby_that_forks_without_end_is_read_only_so_far(tmp_path):
    """A chain of 200 processes (the agent runs the user's interpreter) and a pid listed as its own
    descendant: the read stops at MAX_PROCESSES, each process once."""
    for pid in range(1000, 1200):
        a_process(tmp_path, pid, 10, (pid + 1, 1000))
    assert standby_memory.tree_bytes([1000], tmp_path) == standby_memory.MAX_PROCESSES * 10 * KIB


def test_a_real_process_is_read_from_proc():
    """This test's own process stands for a standby: its Pss is a real figure, its tree at least
    that; a pid past pid_max is no process."""
    me = os.getpid()
    own = standby_memory.pss_bytes(me)
    assert own is not None and own > 1024 * KIB, "an interpreter with pytest imported holds more than 1 MiB"
    tree = standby_memory.tree_bytes([me])
    assert tree is not None and tree >= own * 0.9, "its tree is at least itself (pages may move between reads)"
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert standby_memory.tree_bytes([pid_max + 1]) is None


def _running_job(tmp_path: Path) -> tuple[Store, int]:
    store = Store(tmp_path / "s.sqlite")
    jid = store.jobs.add(parse_spec("name: std\nscript: train.py\nlauncher: torchrun\n"), 0, "root", "/x", 1.0)
    store.jobs.transition(jid, JobState.STARTING, "starting", 2.0)
    store.attempts.start(jid, number=1, attempt_id="u1", now=10.0, resumed_from=None, resumed_from_step=None, port=1)
    store.jobs.transition(jid, JobState.RUNNING, "fresh start", 10.0)
    return store, jid


def test_the_view_status_and_metrics_show_the_standby_read_at_the_view(tmp_path, capsys):
    store, jid = _running_job(tmp_path)
    run = tmp_path / "run"
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    try:
        none = job_view(store, store.jobs.get(jid), run)
        gone = job_view(store, store.jobs.get(jid), run, standbys={jid: [pid_max + 1]})
        ready = job_view(store, store.jobs.get(jid), run, standbys={jid: [os.getpid()], jid + 1: [pid_max + 1]})
    finally:
        store.close()
    assert none.standby_memory_bytes is None and gone.standby_memory_bytes is None
    assert ready.standby_memory_bytes is not None and ready.standby_memory_bytes > 1024 * KIB
    assert none.to_json()["standby_memory_bytes"] is None

    print_status(none.to_json())
    assert "standby" not in capsys.readouterr().out
    doc = {**ready.to_json(), "standby_memory_bytes": 231 * 1024 * KIB + 400 * KIB}
    print_status(doc)
    assert "  standby: next attempt's launcher ready, 231 MiB (launch_standby)\n" in capsys.readouterr().out

    metrics, ok = JobCollector(lambda: [none, ready]).collect()
    family = next(m for m in metrics if m.name == "spx_job_standby_memory_bytes")
    assert ok and [(s.labels, s.value) for s in family.samples] == [({"spx_job": "std"},
                                                                    float(ready.standby_memory_bytes))]


def _view(name: str, standby: int | None) -> JobView:
    return JobView(name=name, state="running", reason=None, owner_uid=0, owner="root", attempts=1, step=None,
                   epoch=None, samples_per_second=None, last_checkpoint_step=None, last_checkpoint_time=None,
                   gpus=[], submitted=1.0, standby_memory_bytes=standby)


def test_the_hosts_gauge_sums_the_standbys_and_is_zero_without_one(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    backend = open_backend("none")
    views: list[JobView] = []
    try:
        host = HostCollector(backend, HostAccount(store, 0.0), lambda: views, wall=lambda: 10.0)

        def total() -> list[float]:
            metrics, ok = host.collect()
            assert ok
            return [s.value for m in metrics if m.name == "spx_standby_memory_bytes" for s in m.samples]

        assert total() == [0.0]
        views += [_view("a", 230 * 1024 * KIB), _view("b", None), _view("c", 4 * 1024 * KIB)]
        assert total() == [234.0 * 1024 * KIB]
    finally:
        backend.close()
        store.close()
