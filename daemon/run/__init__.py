"""Run: scheduling, supervision and the processes of each attempt.

    placement (a scheduling turn made real) → scheduler (which job starts now, on which GPUs)
    ← queue_rules (holds, drain, dependencies, limits) ← queue_control (hold, release, priority, drain)
    → supervisor (the loop: per job, its state machine (the lifecycle package) → executor), job_turns
    (one job's turn, its faults contained), tracking (a job's record from the store), snapshot (what
    other threads read)
    → executor (the dispatcher of the machine's actions over its effects): attempt_runtime (an
    attempt's handles, what is seen of it each turn), launching (the row, then the launch through a
    standby or cold), standby_pool (launchers started ahead) ← standby (one of them; standby_agent
    waits for its plan, and starts standby_worker, the workers ahead, where a job asks), attempt_prep
    (files and checkpoint as the user), postmortem (stack dumps, root cause), gang_link (across hosts: beats and agreement) ← gang (the generation every host's
    share runs in), store_writes, staging_runs (the copier), adoption (attempts a previous daemon
    left), incidents (an incident per failed attempt) ← incident (its document, assembled),
    verification (a replay job's verdict, stored on the job it verified, which is rolled back),
    auto_verify (the periodic replays a job's `verify:` asks for, on idle GPUs),
    user_work (all of it that can wait on a user, in that user's lane: core.lanes)
    → launcher (argv, env, user) → attempt_monitor (records the exit) → enter_attempt (root exec shim:
    cgroup, user, exec) → workers; exit_wake (one thread on every pidfd: the loop wakes when a launcher
    exits) ← worker_watch (a worker's abnormal death, seen as it happens);
    rendezvous (torchrun's meeting point, across hosts); attempt_files (the attempt's files, safely),
    checkpoint_report (what discovery decided), local_tier (the host-local checkpoint dir), timeline
    (where a restart spent its time), progress_log (each attempt's progress from its heartbeats, for
    the goodput ledger), lease_keeper (the job's `.spx/` lease), proctree/cgroups (the
    processes), device_filter (the attempt cgroup's device program: only its GPUs' /dev/nvidiaN
    open), rank_cpu (a rank's run-queue wait: CPU contention), log_relay (the capped attempt log),
    rootcause/oom (why it ended); invalid_specs (at
    start: a job whose accepted spec this version refuses ends failed); notify (owners told of ends and
    restarts) → notify_send (one webhook or command, as the owner); retention (old finished jobs
    removed) → retention_files (their files).

Third stage of the flow spool → intake → state → run → workers; the only writer of job states after
intake. Never imports torch.
"""
