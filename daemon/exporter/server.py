"""The daemon's metrics registry and its HTTP endpoint.

    registry = build_registry(backend, jobs, version)              # own registry, never the global one
    server = serve(registry, "127.0.0.1:9101")                     # port 0 = pick a free one
    ...
    server.shutdown()

`build_registry` also starts the backend's XID event thread (idempotent; `backend.close()` stops it),
because `spx_gpu_xid_errors_total` counts events between scrapes.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import structlog
from prometheus_client import CollectorRegistry, start_http_server

from spx.daemon.core.turn_times import TurnTimes
from spx.daemon.exporter.gpu_collector import GpuCollector
from spx.daemon.exporter.host_collector import HostCollector
from spx.daemon.exporter.housekeeping_collector import HousekeepingCollector, Samples
from spx.daemon.exporter.job_collector import JobCollector
from spx.daemon.exporter.loop_collector import LoopCollector
from spx.daemon.exporter.metrics import Families
from spx.daemon.exporter.quarantine_collector import QuarantineCollector, Quarantined
from spx.daemon.exporter.queue_collector import QueueCollector
from spx.daemon.exporter.scrape_jobs import ScrapeJobs
from spx.daemon.gpu.backend import GpuBackend
from spx.daemon.gpu.evidence import EvidenceBoard
from spx.daemon.state.ledger_view import HostAccount
from spx.daemon.state.views import JobView

log = structlog.get_logger(__name__)

DEFAULT_ADDRESS = "127.0.0.1:9101"


class Part(Protocol):
    def collect(self) -> tuple[list[Any], bool]: ...


class StragglerExplainer(Protocol):
    """The daemon's straggler watch (service/stragglers.py), which sits above the exporter."""

    board: EvidenceBoard | None

    def annotate(self, views: list[JobView]) -> list[JobView]: ...


class SpxCollector:
    """Runs each part, times it, and reports `spx_scrape_duration_seconds`/`spx_scrape_success` for it.

    A part that raises is logged and reported with success 0; the other parts still answer, so one
    bug or driver fault never turns the whole scrape into an HTTP 500.
    """

    def __init__(self, parts: dict[str, Part], version: str, backend_kind: str, jobs: ScrapeJobs) -> None:
        self.parts = parts
        self.version = version
        self.backend_kind = backend_kind
        self.jobs = jobs  # the parts' one read of the jobs per scrape

    def describe(self) -> Iterable[Any]:
        return []  # no collect() at register time: it would read NVML

    def collect(self) -> Iterable[Any]:
        meta = Families(["spx_scrape_duration_seconds", "spx_scrape_success", "spx_build_info", "spx_gpu_backend_info"])
        out: list[Any] = []
        with self.jobs.scrape():
            self._parts(meta, out)
        meta.add("spx_build_info", {"version": self.version}, 1)
        meta.add("spx_gpu_backend_info", {"kind": self.backend_kind}, 1)
        return out + meta.metrics()

    def _parts(self, meta: Families, out: list[Any]) -> None:
        for name, part in self.parts.items():
            start = time.perf_counter()
            try:
                metrics, ok = part.collect()
            except Exception:
                log.exception("collector_failed", collector=name)
                metrics, ok = [], False
            meta.add("spx_scrape_duration_seconds", {"collector": name}, time.perf_counter() - start)
            meta.add("spx_scrape_success", {"collector": name}, 1 if ok else 0)
            out.extend(metrics)


def build_registry(
    backend: GpuBackend, jobs: Callable[[], list[JobView]] | ScrapeJobs, version: str, job_labels: bool = True,
    quarantined: Callable[[], Quarantined] | None = None, drained: Callable[[], str | None] | None = None,
    host_account: HostAccount | None = None,
    housekeeping: list[Samples] | None = None, stragglers: StragglerExplainer | None = None,
    loop_turns: TurnTimes | None = None,
) -> CollectorRegistry:
    """A fresh registry with the GPU and job collectors. Starts the backend's XID thread (see module doc).

    `job_labels=False` (config `metrics_job_labels`) keeps job names out of the scrape, which any local
    user can read: the GPU collector is told of no jobs (no `spx_job` label) and the per-job part is left out.
    `jobs`: the views, read once per scrape (scrape_jobs.py); the daemon's, a `ScrapeJobs`, also gives
    the host's account the live jobs' ledgers it computed for them.
    """
    shared = jobs if isinstance(jobs, ScrapeJobs) else ScrapeJobs(lambda _now, _ledgers: jobs())
    backend.start_xid_watch()
    registry = CollectorRegistry(auto_describe=False)
    board = stragglers.board if stragglers is not None else None
    parts: dict[str, Part] = {"gpu": GpuCollector(backend, shared.views if job_labels else _no_jobs, board)}
    if job_labels:  # after "gpu": its scrape leaves the GPU evidence a straggler is explained with
        parts["job"] = JobCollector(shared.views, stragglers.annotate if stragglers is not None else None)
    if quarantined is not None:  # the daemon's store (spx_gpu_quarantined); not the standalone exporter
        parts["quarantine"] = QuarantineCollector(backend, quarantined)
    if drained is not None:  # the daemon's store (spx_queue_drained); not the standalone exporter
        parts["queue"] = QueueCollector(drained)
    if host_account is not None:  # the daemon's store (spx_host_gpu_seconds_total); not the standalone exporter
        parts["host"] = HostCollector(backend, host_account, shared.views,
                                      live=shared.live_ledgers if isinstance(jobs, ScrapeJobs) else None)
    if housekeeping is not None:  # the daemon's retention and notifications; not the standalone exporter
        parts["housekeeping"] = HousekeepingCollector(housekeeping)
    if loop_turns is not None:  # the daemon's main loop (spx_daemon_loop_turn_seconds); not the standalone exporter
        parts["loop"] = LoopCollector(loop_turns)
    registry.register(SpxCollector(parts, version, backend.kind, shared))
    return registry


def _no_jobs() -> list[JobView]:
    return []


def parse_address(address: str) -> tuple[str, int]:
    """'HOST:PORT' or '[V6]:PORT' -> (host, port). A bare ':PORT' is refused: say which interface."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--metrics-address {address!r}: expected HOST:PORT, e.g. 127.0.0.1:9101")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        ipaddress.IPv6Address(host)
    return host, int(port)


class MetricsServer:
    """The /metrics HTTP endpoint (prometheus-client's threaded WSGI server) on one address."""

    def __init__(self, httpd: Any, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread
        self.host: str = httpd.server_address[0]
        self.port: int = httpd.server_port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def shutdown(self) -> None:
        """Stop serving, close the socket and join the server thread."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def serve(registry: CollectorRegistry, address: str = DEFAULT_ADDRESS) -> MetricsServer:
    host, port = parse_address(address)
    httpd, thread = start_http_server(port, addr=host, registry=registry)
    thread.name = "spx-metrics-http"
    server = MetricsServer(httpd, thread)
    log.info("metrics_listening", url=server.url)
    return server
