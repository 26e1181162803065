"""Core: what every other package of the daemon builds on, and which builds on none of them.

    config (the daemon's config file and flags) · log (structlog JSON lines) ← journal (each line as a
    journal entry with its level and job when under journald) · users (is this uid an
    admin; its name; who reads its logs) · spec (the job file's model) ← spec_yaml (the safe YAML
    reader it parses with), nodes (a job across hosts: its `nodes:` block), restart_spec (its
    `restart:` block: relaunches, backoff, hang timeout, a rule per failure class), notify_spec (its
    `notify:` block, also the config's default: webhook, command, events), replay_spec (its `replay:`
    block: the job verifies another's checkpoints) · lanes (off-loop work
    for users, fair by owner, deadlines from the start) · bounded (the one reader for numbers and
    structures in files a user writes: JSON with size, depth and number caps, typed fields, Garbage)
    · causes (why an attempt stopped, how its end is classed: the words the store, the machine, root
    cause and `spx` share) · version (the installed package's version) · turn_times (how long the
    main loop's turns take: the loop adds, /metrics reads) · malloc_arenas (caps glibc's malloc arenas at
    start-up, before threads come and go)

The leaf of the package graph (docs/architecture.md): it imports nothing from `spx.daemon`. `bounded`
is stdlib-only, so `contract` (shared with spx.trainer) may import it.
"""
