"""Run: scheduling, supervision and the processes of each attempt (design §7).

    scheduler (which job starts now, on which GPUs) → supervisor (the loop: per job, step → executor)
    → launcher (argv, env, user) → attempt_monitor (records the exit) → enter_attempt (root exec shim: cgroup, user, exec) → workers;
    standby (the launcher started ahead: standby_agent waits for the plan), rendezvous (torchrun's meeting point, across hosts),
    gang (across hosts: the generation every host's share runs in, agreed in the shared checkpoint dir);
    step (the pure state machine of one job; its values in step_types), executor (performs its actions, slow work off the loop),
    policy (after an exit: restart, back off, give up), attempt_files (the attempt's files, safely),
    proctree/cgroups (the processes), log_relay (the capped attempt log), rootcause/oom (why it ended).

Third stage of the flow spool → intake → state → run → workers; the only writer of job states after
intake. Reads GPUs through `spx.daemon.gpu`, never imports torch.
"""
