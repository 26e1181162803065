"""The GPUs: NVML, or the fake fixture with NVML's API, and what the daemon asks of them.

    backend (which NVML, and the scheduler's questions: idle, computing, healthy) ← fields (the
    field-values request the collector reads) · gate (which GPUs may be given to an attempt; the
    quarantine) ← health (the checks a GPU must pass)
    · evidence (each GPU's latest speed readings: clock, throttle reasons, temperature, power, link
    errors; the collector's scrapes fill it) ← straggler (a slow rank named, its GPU found, its
    cause given from that evidence)
    · xid (the XID event thread) · recent (each GPU's last readings and XIDs, for incidents) ·
    kernel_log (the kernel's lines about a GPU, bounded) · fake (the fixture-driven fake NVML) ← fake_api (its pynvml
    functions by subject: identity, readings, health, events) ← fake_state (its devices, faults and
    test hooks; the wrapper every call goes through) ← fake_sim (its devices and event sets),
    fake_procs (which live processes it reports on which GPU)

The fake is chosen by config (`--gpu-backend fake`), never by accident.
"""
