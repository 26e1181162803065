"""User files: the one way the root daemon touches a path a user controls (design §9).

`fsafe` walks from trusted directory fds without following links, opens non-blocking, reads with a
cap and changes owner and mode on fds; `as_user` runs what belongs in the user's own tree (mkdir -p
of a checkpoint dir, access checks, checkpoint discovery) as the job's owner, with the owner's groups.
Nothing else in the daemon opens a path under a user-writable directory
(tests/unit/test_user_paths_guard.py holds the list of modules whose paths are the daemon's own).
"""
