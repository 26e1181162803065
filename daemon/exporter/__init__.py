"""`/metrics`: what Prometheus scrapes. A reader: it changes nothing.

    server (the registry and the HTTP endpoint) → gpu_collector (NVML, per GPU and NVLink link;
    gpu_reading: each scrape summarised for the GPU's recent readings),
    job_collector (per-job series from the job views), quarantine_collector, queue_collector, housekeeping_collector
    (retention and notifications);
    metrics (every metric's name, type, labels and help, in one table)
"""
