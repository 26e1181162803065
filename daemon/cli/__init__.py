"""`spx`: the command line users and operators type. A reader of the flow, never its writer.

    main (submit / ls / status / logs / cancel / doctor) · top + top_command (live view)

Changes go through the spool (submit) or the daemon's control socket (cancel); reads through the
control socket, so `spx` needs no access to the store.
"""
