"""The torch-free contracts between the daemon and the workers it runs (design §5, §6).

`worker_env` names the environment every attempt gets and the heartbeat it writes back;
`checkpoint_layout` says what a complete checkpoint is. `spx.trainer` imports both, the daemon reads
through them: neither side re-implements the other's half. Stdlib only.

Data flow: spool → intake → state → run → workers; exporter and CLI read. This package sits beside
that flow: the run side writes the environment, workers write heartbeats and checkpoints.
"""
