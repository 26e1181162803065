"""`spx doctor`: is this host set up the way training needs? Read-only: it judges, never changes.

    command (CLI glue) → report (runs every check) ← check (the result type), gpu_checks,
    device_checks (jobs confined to their GPUs' device nodes), storage_checks, hostprobe (facts
    about mounts, devices, virtualization)

Outside the job flow: it reads the config, the GPU backend and the host.
"""
