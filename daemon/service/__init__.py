"""The daemon process itself: configuration, logging, the main loop, the control socket, systemd.

    main (`spx-trainer`: the loop that drives intake and run) · config · log (structlog JSON)
    · control (the Unix socket `spx` talks to) · sd_notify + status_line (what systemd shows)

It wires the flow spool → intake → state → run → workers together on one thread, and serves the
readers (control socket, exporter) from the state package.
"""
