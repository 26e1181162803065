"""`spx`: the command line users and operators type. A reader of the flow, never its writer.

    main (the parser and the dispatch: ls / status / cancel / adopt / gpus / doctor) · client (one
    request to the daemon's control socket, its error as an exit status; root's read-only look at the
    store when no daemon answers) · render (the text of `spx ls`, `spx status`, `spx gpus`) · submit
    (`spx submit FILE`: into the spool, intake's answer, what it resumes from) ← submit_cmdline
    (`spx submit -- COMMAND`) ← launch_cmdline (what a torchrun/deepspeed/python line says) · logs
    (`spx logs`: through restarts, an earlier job's by its id) ← log_lines (rank prefix, timestamps,
    --since, reading from the end, the separator) · queue_cmds (hold, release, priority, drain) · timeline
    (`spx status --timeline`) · top + top_command (the live view) · socket_hint (no daemon answers:
    which `--root` does, asking only sockets no one else controls)

Changes go through the spool (submit) or the daemon's control socket (cancel); reads through the
control socket, so `spx` needs no access to the store.
"""
