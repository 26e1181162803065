"""tests/processes: the daemon's parts one at a time, with the real processes, users, cgroups and mounts
of this machine (no daemon); their tests without any are in tests/unit, which starts none."""
