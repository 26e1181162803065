"""State: the durable store, the job states and the read-only views every reader shares.

    states (enum + allowed edges, stdlib only) · store (SQLite, one writer) · views (snapshot types)
    · jobviews (store + heartbeats → views)

Second stage of the flow spool → intake → state → run → workers. Intake adds jobs; the run package
is the only writer of their later states; the exporter, the CLI and systemd's status line read views.
"""
