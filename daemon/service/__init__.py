"""The daemon process itself: the main loop, the control socket, systemd.

    main (`spx-trainer`: flags, one-shot modes, start-up) → daemon (the loop and its wiring)
    → cadence (how long the loop waits between turns: often while something moves, once a second at rest)
    · control (the Unix socket `spx` talks to) → requests (every request: who may, where answered)
    → answers (the reads) → stragglers (slow ranks explained in the views) · gpu_rows (the GPUs as `spx top` shows them)
    · sd_notify + status_line (what systemd shows) · reload (`systemctl reload`: re-exec in place)
    · handover (reload and stop between one daemon process and the next)
    · dcgm_mapping (dcgm-exporter's job-mapping files: the job on each GPU) · wedge_hook (a test hook:
    block the loop on request, for the watchdog's test)

It wires the flow spool → intake → state → run → workers together on one thread, and serves the
readers (control socket, exporter) from the store and the supervisor's published snapshot.
"""
