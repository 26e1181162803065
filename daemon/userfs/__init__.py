"""User files: the one way the root daemon touches a path a user controls.

    fsafe (dir-fd walks, O_NOFOLLOW, non-blocking, capped reads, fchown on fds) · heartbeat (the
    heartbeat, read through fsafe) · as_user (run an action as the job's owner) ← as_user_session
    (kept children for every-second work) → user_actions (the child side) → spx_dir (the `.spx/`
    record, lease and end marker), gang_dir (the `.spx-gang/` generations across hosts) → cas (their one compare-and-swap under flock, with a generation: the
    fencing token); webhook (a job's notify POST, as its owner, in user_actions); identity (become
    the owner: groups, gid, uid)

Nothing else in the daemon opens a path under a user-writable directory
(tests/unit/test_user_paths_guard.py holds the list of modules whose paths are the daemon's own).
"""
