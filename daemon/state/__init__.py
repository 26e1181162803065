"""State: the durable store, the job states and the read-only views every reader shares.

    states (enum + allowed edges, stdlib only) · store (the `Store` callers hold: its tables by
    subject) ← jobs_table (jobs, JobRow), attempts_table (attempts, AttemptRow), host_tables
    (quarantined GPUs, the drain switch), incidents_table (one incident per failed attempt),
    verifications_table (replays' verdicts; strikes against GPUs that computed wrong numbers),
    housekeeping_table (events in order; removing finished
    jobs) ← db (the SQLite file: per-thread connections, write
    transactions, StoreUnavailable/StoreRefused) ← fault_points (the tests' kill-at-a-write hook);
    schema (every table and column, numbered migrations, `PRAGMA user_version`) · integrity (is the
    store whole and ours) · backup (scheduled online backups) · views (snapshot types) ← jobviews
    (store + heartbeats → views) ← standby_memory (what a job's standby holds now, from /proc),
    node_view (a job's share on this host, across hosts), phases (the names of a restart's phases),
    accounting (what each job used: elapsed, GPU-hours, peak memory;
    `spx history`), incident_views (a job's incidents with their recovery: `spx incidents`) · goodput
    (the pure ledger: a job's every second by cause, the host's GPU-seconds) ← ledger_view (the
    store's facts → ledgers) ← attempt_progress (an attempt's progress record from its heartbeats)

Second stage of the flow spool → intake → state → run → workers. Intake adds jobs; the run package
is the only writer of their later states; the exporter, the CLI and systemd's status line read views.
"""
