"""Run: scheduling, supervision and the processes of each attempt (design §7).

    scheduler (which job gets which GPUs) → supervisor (one attempt per job, watched) → launcher
    (argv, env, user) → enter_attempt (root exec shim: cgroup, user, exec) → workers;
    policy (after an exit: restart, back off, give up), attempt/proctree/cgroups (the processes),
    rootcause/oom (why it ended).

Third stage of the flow spool → intake → state → run → workers; the only writer of job states after
intake. Reads GPUs through `spx.daemon.gpu`, never imports torch.
"""
