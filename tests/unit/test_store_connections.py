"""The store's per-thread connections end with their threads: the daemon answers every control
request and every scrape on a thread of its own, so a connection left to the garbage collector
would hold its file descriptors long after its thread ended."""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path

from harness import wait_for
from spx.daemon.state import db as db_module
from spx.daemon.state.store import Store


def open_fds_of(path: Path) -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith(str(path))
        except OSError:  # the listing's own fd, gone
            pass
    return n


def read_on_threads(store: Store, n: int) -> None:
    for _ in range(n):
        t = threading.Thread(target=store.jobs.live)
        t.start()
        t.join()


def test_a_reader_threads_connection_closes_when_the_thread_ends(tmp_path):
    db = tmp_path / "spx.sqlite"
    store = Store(db)
    gc.disable()  # the point: closed by the thread's end, not by a collection
    try:
        # SQLite keeps one closed connection's descriptor while another connection of the process
        # holds locks on the file (closing it would drop them): measured after the first readers.
        read_on_threads(store, 2)
        settled = open_fds_of(db)
        read_on_threads(store, 40)
        # join() returns a moment before the thread's state (and its locals) is cleared
        wait_for(lambda: open_fds_of(db) <= settled, 5, "the threads' connections to close")
    finally:
        gc.enable()
    assert store.jobs.live() == []


def test_every_connection_has_the_small_page_cache(tmp_path):
    """Each thread's connection is opened with the store's bounded page cache (db.CACHE_KIB), not
    SQLite's default 2,000 KiB: the long-lived threads' caches otherwise grow with the store."""
    store = Store(tmp_path / "spx.sqlite")
    sizes = [store.db.conn.execute("PRAGMA cache_size").fetchone()[0]]

    def read() -> None:
        sizes.append(store.db.conn.execute("PRAGMA cache_size").fetchone()[0])

    t = threading.Thread(target=read)
    t.start()
    t.join()
    assert sizes == [-db_module.CACHE_KIB] * 2
