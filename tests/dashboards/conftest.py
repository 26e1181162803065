"""The live stack (dashboards_live.py) as one fixture: the daemon, its training job and Prometheus
start once per module (a minute or so on 2 cores). Module scope, not package: in a folder without
__init__.py pytest keeps a "package" fixture until the session ends, and this stack's job would
hold fake GPUs 0 and 1 through every later test."""

from __future__ import annotations

import pytest
from dashboards_live import LiveHost, Prometheus

from harness import wait_for

DATA_TIMEOUT_S = 180  # generous: the stack needs ~10 s of scrapes, a loaded CI machine more


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    host = LiveHost(tmp_path_factory.mktemp("live-host"))
    prometheus = None
    try:
        prometheus = Prometheus(tmp_path_factory.mktemp("prometheus"), host.address)
        _wait_for_enough_data(prometheus)
        yield host, prometheus
    finally:
        try:
            if prometheus is not None:
                prometheus.stop()
        finally:
            host.stop()


def _wait_for_enough_data(prom: Prometheus) -> None:
    """Ten scrapes (rates need two samples in their window), two observed checkpoints, and the
    recording rules evaluated."""
    def ready() -> bool:
        return bool(
            prom.query('count_over_time(up{job="spx-trainer"}[1m]) >= 10')
            and prom.query("instance_spx_job:spx_job_checkpoint_interval:avg6h")
            and prom.query("instance_gpu_link:spx_gpu_nvlink_transmit_bytes:rate1m")
        )

    try:
        wait_for(ready, DATA_TIMEOUT_S, "ten scrapes and the recording rules")
    except AssertionError as err:
        raise AssertionError(f"{err}\nprometheus log:\n{prom.log_tail()}") from None
