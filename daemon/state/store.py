"""The durable state store: one SQLite file (`db`), its tables by subject — `jobs`, `attempts`,
`host` (quarantined GPUs, the drain switch), `housekeeping` (events in order; finished jobs'
removal), `incidents` (one per failed attempt), `verifications` (replays' verdicts, strikes against
GPUs) — made or upgraded to this version's schema at open.

Every state change is one transaction, so a daemon killed with SIGKILL at any instant restarts into
a consistent store: each job is in exactly one state, each attempt is open or closed. The main loop
is the only writer; readers (the control socket, the exporter) use their own per-thread connections.
"""

from __future__ import annotations

from pathlib import Path

from spx.daemon.state import schema
from spx.daemon.state.attempts_table import AttemptsTable
from spx.daemon.state.db import Database
from spx.daemon.state.host_tables import HostTables
from spx.daemon.state.housekeeping_table import HousekeepingTable
from spx.daemon.state.incidents_table import IncidentsTable
from spx.daemon.state.jobs_table import JobsTable
from spx.daemon.state.verifications_table import VerificationsTable


class Store:
    """The daemon's store. Opened to write (the daemon), it is created or migrated to the current
    schema; opened `readonly` (the CLI without a daemon, tests), it is read as it is. Either way a
    store of a newer schema than this code knows raises `StoreRefused`."""

    def __init__(self, path: Path, readonly: bool = False):
        self.db = Database(path, readonly)
        if readonly:
            schema.check_readable(self.db.conn, path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            schema.prepare(self.db.conn, path)
        self.jobs = JobsTable(self.db)
        self.attempts = AttemptsTable(self.db)
        self.host = HostTables(self.db)
        self.incidents = IncidentsTable(self.db)
        self.housekeeping = HousekeepingTable(self.db)
        self.verifications = VerificationsTable(self.db)

    def close(self) -> None:
        """Close this thread's connection now (the next use opens a fresh one)."""
        self.db.close()
