"""`spx`: the command line users and operators type. A reader of the flow, never its writer.

    main (submit / ls / status / logs / cancel / doctor) · submit_cmdline (`spx submit -- COMMAND`)
    ← launch_cmdline (what a torchrun/deepspeed/python line says) · queue_cmds (hold, release,
    priority, drain) · timeline (`spx status --timeline`) · top + top_command (the live view) ·
    socket_hint (no daemon answers: which `--root` does, asking only sockets no one else controls)

Changes go through the spool (submit) or the daemon's control socket (cancel); reads through the
control socket, so `spx` needs no access to the store.
"""
