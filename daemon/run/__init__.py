"""Run: scheduling, supervision and the processes of each attempt (design §7).

    scheduler (which job starts now, on which GPUs) → supervisor (the loop: per job, step → executor)
    → launcher (argv, env, user, log relay) → enter_attempt (root exec shim: cgroup, user, exec) → workers;
    step (the pure state machine of one job), executor (performs its actions, slow work off the loop),
    policy (after an exit: restart, back off, give up), attempt_files (the attempt's files, safely),
    proctree/cgroups (the processes), rootcause/oom (why it ended).

Third stage of the flow spool → intake → state → run → workers; the only writer of job states after
intake. Reads GPUs through `spx.daemon.gpu`, never imports torch.
"""
