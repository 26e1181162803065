"""The torch-free contracts between the daemon and the workers it runs.

    worker_env (the SPX_* environment every attempt gets, and the heartbeat it writes back)
    ← metrics (a loss or norm as JSON holds it, NaN/±Inf included), replay_verdict (what a
    verification replay found, in its last beat)
    ← fencing (an attempt publishes a checkpoint only while the job's lease is still its own)
    · checkpoint_layout (what a complete checkpoint is) ← checkpoint_formats (completeness rules of
    the formats other libraries write) ← checkpoint_discovery (which checkpoint a relaunch resumes
    from) ← checkpoint_tiers (host-local copy or persistent one)

`spx.trainer` imports these, the daemon reads through them: neither side re-implements the other's
half. Stdlib only (core.bounded, which reads their JSON and numbers, is too). The run side writes
the environment, workers write heartbeats and checkpoints.
"""
