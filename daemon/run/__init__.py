"""Run: scheduling, supervision and the processes of each attempt.

    placement (a scheduling turn made real) → scheduler (which job starts now, on which GPUs)
    ← queue_rules (holds, drain, dependencies, limits) ← queue_control (hold, release, priority, drain)
    → supervisor (the loop: per job, step → executor)
    → launcher (argv, env, user) → attempt_monitor (records the exit) → enter_attempt (root exec shim:
    cgroup, user, exec) → workers; exit_wake (the loop wakes when a launcher exits);
    standby (the launcher started ahead: standby_agent waits for the plan), rendezvous (torchrun's
    meeting point, across hosts), gang (across hosts: the generation every host's share runs in);
    step (the pure state machine of one job; its values in step_types), executor (performs its
    actions, slow work off the loop), policy (after an exit: restart, back off, give up),
    resume_fallback (the crash-loop fallback checkpoint), attempt_files (the attempt's files,
    safely), checkpoint_report (what discovery decided), local_tier (the host-local checkpoint
    dir), timeline (where a restart spent its time), lease_keeper (the job's `.spx/` lease),
    proctree/cgroups (the processes), device_filter (the attempt cgroup's device program: only its
    GPUs' /dev/nvidiaN open), log_relay (the capped attempt log), rootcause/oom (why it ended);
    invalid_specs (at start: a job whose accepted spec this version refuses ends failed).

Third stage of the flow spool → intake → state → run → workers; the only writer of job states after
intake. Never imports torch.
"""
