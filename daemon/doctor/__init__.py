"""`spx doctor`: is this host set up the way training needs? Read-only: it judges, never changes.

    command (CLI glue) → report (runs every check) ← check (the result type), gpu_checks (count,
    models, NVLink, BF16, driver and NVML), device_checks (jobs confined to their GPUs' device
    nodes), storage_checks, cgroup_checks (the daemon's cgroup delegated to it), stackdump_checks
    (py-spy dumps a hung job's stacks), worker_checks (the job environment: torch, GPUs, and that
    other users can run it), hostprobe (facts about mounts, devices, virtualization)

Outside the job flow: it reads the config, the GPU backend and the host.
"""
