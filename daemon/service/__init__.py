"""The daemon process itself: the main loop, the control socket, systemd.

    main (`spx-trainer`: the loop that drives intake and run) · control (the Unix socket `spx` talks
    to) · queue_control (hold, release, priority, drain) · gpu_rows (the GPUs as `spx top` shows
    them) · sd_notify + status_line (what systemd shows) · handover (reload and stop between one
    daemon process and the next)

It wires the flow spool → intake → state → run → workers together on one thread, and serves the
readers (control socket, exporter) from the state package.
"""
