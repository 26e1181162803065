"""`/metrics`: what Prometheus scrapes. A reader: it changes nothing.

    server (the registry and the HTTP endpoint; scrape_jobs: the jobs' views read once per scrape,
    shared by the parts) → gpu_collector (NVML, per GPU and NVLink link;
    gpu_reading: each scrape summarised for the GPU's recent readings),
    job_collector (per-job series from the job views, their goodput ledger too), host_collector (the
    host's GPU-seconds by cause), quarantine_collector, queue_collector, housekeeping_collector
    (retention and notifications), loop_collector (the main loop's turn times);
    metrics (every metric's name, type, labels and help, in one table)
"""
