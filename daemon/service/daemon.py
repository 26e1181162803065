"""The daemon's main loop, and the wiring of its parts.

One main loop on one thread owns the state store: each turn it claims spool files, makes the changes
users asked for, supervises attempts, places jobs on GPUs, and publishes a snapshot for the readers.
Other threads (inotify, the control socket's clients, the metrics server, the XID watcher, the lanes
that do users' work off the loop) only read the store or the snapshot (the supervisor's frozen one,
run/snapshot.py) or hand work to the loop through queues. Every stage of a turn is contained: a store
that refuses writes is shown in STATUS and retried; any other error is logged once and the loop goes
on. The watchdog ping is sent only after a full turn, so it proves the loop turns.
"""

from __future__ import annotations

import functools
import os
import queue
import sys
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.lanes import Lanes
from spx.daemon.core.log import get_logger
from spx.daemon.core.malloc_arenas import Trim
from spx.daemon.core.turn_times import TurnTimes
from spx.daemon.core.users import user_name
from spx.daemon.core.version import daemon_version
from spx.daemon.gpu.backend import GpuBackend, XidEvent
from spx.daemon.gpu.gate import GpuGate
from spx.daemon.intake.accept import Intake
from spx.daemon.intake.adopt import Adopter
from spx.daemon.lifecycle.record import Phase
from spx.daemon.run import auto_verify, cgroups, proctree
from spx.daemon.run.device_filter import DeviceFilters
from spx.daemon.run.incidents import GpuSources
from spx.daemon.run.invalid_specs import fail_invalid_specs
from spx.daemon.run.lease_keeper import LeaseKeeper
from spx.daemon.run.notify import Notifications
from spx.daemon.run.placement import Placement
from spx.daemon.run.queue_control import QueueControl
from spx.daemon.run.retention import Retention
from spx.daemon.run.supervisor import Supervisor
from spx.daemon.service import handover, reload, wedge_hook
from spx.daemon.service.answers import Answers
from spx.daemon.service.cadence import Cadence
from spx.daemon.service.control import Command, ControlServer
from spx.daemon.service.dcgm_mapping import DcgmJobMapping
from spx.daemon.service.requests import REQUESTS, Target, error, find_job
from spx.daemon.service.sd_notify import Notifier
from spx.daemon.service.status_line import format_status
from spx.daemon.state import jobviews
from spx.daemon.state.backup import Backups
from spx.daemon.state.db import StoreUnavailable
from spx.daemon.state.goodput import Ledger
from spx.daemon.state.ledger_view import HostAccount
from spx.daemon.state.store import Store
from spx.daemon.state.views import JobView

if TYPE_CHECKING:
    from spx.daemon.exporter.server import MetricsServer

log = get_logger()
REAP_EVERY_SECONDS = 2.0
STATUS_EVERY_SECONDS = 2.0


class StartError(Exception):
    """The daemon cannot start as configured; the message says why and the fix."""


class Daemon:
    def __init__(self, cfg: DaemonConfig, backend: GpuBackend, notifier: Notifier,
                 cgroup_tree: cgroups.CgroupTree | None = None, cgroups_reason: str = "no cgroup tree given"):
        self.cfg = cfg
        self.backend = backend
        self.notifier = notifier
        self.wake: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self.stopping = False
        self.reload_requested = False
        self._reload_deferred_for: tuple[str, ...] = ()
        self._prepare_dirs()
        self.store = Store(cfg.store_path)
        self.backups = Backups(cfg.store_path, cfg.backup_dir, cfg.backup_every_seconds, cfg.backup_keep)
        self.lanes = Lanes(cfg.user_work.slots_total, cfg.user_work.slots_per_owner, wake=lambda: self.wake.put("lane"))
        # Which /dev/nvidiaN an attempt may open (its GPUs' minors); logged and recorded once here.
        self.device_filters = DeviceFilters({d.index: d.minor for d in backend.devices()},
                                            None if cgroup_tree else cgroups_reason,
                                            functools.partial(handover.mark_device_filter, cfg.run_dir))
        self.gate = GpuGate(backend, self.store)
        self.supervisor = Supervisor(cfg, self.store, cgroup_tree=cgroup_tree, wake=lambda: self.wake.put("slow"),
                                     gpu_computing=backend.computing, lanes=self.lanes,
                                     device_filters=self.device_filters, gpu_sources=GpuSources.of(backend),
                                     quarantine=self.gate.quarantine)
        self.store_problems: dict[str, str] = {}  # loop stage → the store's refusal (disk full, locked)
        self._faults_logged: set[str] = set()
        self.intake = Intake(cfg, self.store, self.wake, self.lanes)
        self.adopter = Adopter(cfg, self.store, self.intake, lambda: self.wake.put("adopt"))  # host loss
        # The lease keeper's thread only reports a lease another host took; the loop stops the attempt.
        self.lost_leases: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()

        def lease_lost(job_id: int, holder: str) -> None:  # on the keeper's thread: only enqueues
            self.lost_leases.put((job_id, holder))
            self.wake.put("lease")

        self.leases = LeaseKeeper(cfg, self.store, on_lost=lease_lost)
        self.queue = QueueControl(cfg, self.store)  # hold/release/priority/drain, and the queue's rules
        self.placement = Placement(self.store, self.supervisor, self.queue, self.gate, backend,
                                   auto_verify=auto_verify.AutoVerify(cfg, self.store))
        answers = Answers(cfg, self.store, backend, self.adopter, self.queue, self.supervisor.snapshot)
        self.stragglers = answers.stragglers  # /metrics shares its GPU evidence board
        self.control = ControlServer(cfg.socket_path, answers, self.commands, self.wake, admin_group=cfg.admin_group)
        # Housekeeping off the loop's critical path: what ended is told to its owner (run/notify.py, in
        # lanes of its own) and, once old enough, removed (run/retention.py); both only hand work to lanes.
        self.notifications = Notifications(cfg, self.store, wake=lambda: self.wake.put("notify"))
        self.retention = Retention(cfg, self.store, self.lanes)
        self.metrics: MetricsServer | None = None
        self.turn_times = TurnTimes()  # each turn's length (spx_daemon_loop_turn_seconds)
        mapping_dir = cfg.metrics.dcgm_job_mapping_dir  # dcgm-exporter's labels: the jobs on the GPUs
        self.dcgm_mapping = DcgmJobMapping(mapping_dir) if mapping_dir is not None else None
        # The changes users ask for (service/requests.py says who may), made here on the loop.
        self._changes: dict[str, Callable[..., dict]] = {
            "cancel": lambda job, by, _arg: {"ok": True, "result": self.supervisor.cancel(job, by)},
            "hold": lambda job, by, _arg: self.queue.hold(job, by),
            "release": lambda job, by, _arg: self.queue.release(job, by),
            "priority": self.queue.priority,
            "drain": lambda _target, by, _arg: self.queue.drain(by),
            "undrain": lambda _target, by, _arg: self.queue.undrain(by),
            "gpu-release": lambda gpu, by, _arg: self.gate.release_text(gpu, by),
        }

    def _prepare_dirs(self) -> None:
        for d in (self.cfg.state_dir, self.cfg.log_dir, self.cfg.run_dir, self.cfg.checkpoints_root):
            d.mkdir(parents=True, exist_ok=True)
        self.cfg.state_dir.chmod(0o700)
        if not self.cfg.spool_dir.exists():
            self.cfg.spool_dir.mkdir(parents=True)
            # Sticky, writable by all, not listable: users can drop but not see or touch others' files.
            self.cfg.spool_dir.chmod(0o1733)

    # --- start ----------------------------------------------------------------------------------

    def start(self) -> None:
        from spx.daemon.exporter.scrape_jobs import ScrapeJobs  # the exporter only once it serves
        from spx.daemon.exporter.server import build_registry, serve

        self.backend.start_xid_watch(self._on_xid)  # before the thread starts: no XID goes unheard
        registry = build_registry(self.backend, ScrapeJobs(functools.partial(self.views, jobviews.EndedViews(self.cfg.metrics_ended_jobs))), daemon_version(), job_labels=self.cfg.metrics_job_labels,
                                  quarantined=self.store.host.quarantined_gpus, drained=self.store.host.drained,
                                  housekeeping=[self.retention.samples, self.notifications.samples],
                                  host_account=HostAccount(self.store, time.time()), stragglers=self.stragglers,
                                  loop_turns=self.turn_times)
        try:  # first: a daemon that cannot serve /metrics adopts no job and claims no file
            metrics = self.metrics = serve(registry, self.cfg.metrics_address)
        except OSError as e:
            raise StartError(
                f"metrics address {self.cfg.metrics_address}: {e.strerror or e} — another spx-trainer (the "
                "systemd service?) or another program serves there; stop it, or give this one another "
                "address (--metrics-address 127.0.0.1:0 picks a free port)") from None
        proctree.become_subreaper()
        for job in fail_invalid_specs(self.store, time.time()):
            log.error("job_spec_invalid_after_upgrade", job=job.name, reason=job.spec_problem)
        handover.clear_stopping(self.cfg.run_dir)
        self.supervisor.recover()
        self.supervisor.sweep_cgroups()
        self.intake.start()
        self.leases.start()
        self.adopter.start()
        self.control.start()
        host = self.cfg.metrics_address.rsplit(":", 1)[0]
        log.info("daemon_ready", version=daemon_version(), root=str(self.cfg.spool_dir.parent),
                 gpu_backend=self.backend.description, metrics=f"{host}:{metrics.port}",
                 spool=str(self.cfg.spool_dir), pid=os.getpid(), adopted=self.supervisor.adopted)
        handover.mark_ready(self.cfg.run_dir, daemon_version(), self.supervisor.adopted)
        self.notifier.ready(self.status_text())

    def _on_xid(self, event: XidEvent) -> None:
        """The XID thread's listener: only enqueues (the loop acts in `_gpu_faults`)."""
        if self.gate.on_xid(event):
            self.wake.put("xid")

    def _leases_lost(self) -> None:
        while True:
            try:
                job_id, holder = self.lost_leases.get_nowait()
            except queue.Empty:
                return
            self.supervisor.lease_lost(job_id, holder)

    # --- what readers see -----------------------------------------------------------------------

    def views(self, kept: jobviews.EndedViews, now: float, ledgers: dict[int, Ledger]) -> list[JobView]:
        """The exporter's jobs (its thread, once a scrape), with the pids and standbys the supervisor published."""
        return jobviews.all_views(self.store, self.cfg.run_dir, self.supervisor.snapshot, now=now, ledgers=ledgers, kept=kept)

    def status_text(self) -> str:
        return format_status(self.store.jobs.live_states(), len(self.backend.devices()), self.supervisor.last_restart, time.time(),
                             self.store_problem(), adopted=self.supervisor.adopted, drained=self.queue.drained)

    # --- the loop -------------------------------------------------------------------------------

    def run(self) -> int:
        self.start()
        next_reap = next_status = next_watchdog = 0.0
        stop_deadline, turn, trim = None, 0, Trim()  # trim: what malloc keeps free goes back (core/malloc_arenas.py)
        watchdog_every = self.notifier.watchdog_interval or 5.0
        dcgm_mapping = self.dcgm_mapping
        cadence = Cadence(watchdog_every)  # how long each wait for a wake-up may last (service/cadence.py)
        while True:
            now = time.monotonic()
            began = time.perf_counter()
            wedge_hook.wedge_if_asked(self.cfg.run_dir)
            self._stage("backup", functools.partial(self.backups.tick, now))
            self._stage("lanes", self.lanes.deliver)
            self._stage("intake", functools.partial(self.intake.claim_due, now))
            self._stage("commands", self._run_commands)
            self._stage("adopt", self.adopter.drain)
            self._stage("gpu_faults", self._gpu_faults)
            self._stage("leases", self._leases_lost)
            self._stage("supervise", self.supervisor.tick)
            if not self.stopping:
                self._stage("schedule", self.placement.turn)
            if dcgm_mapping is not None:
                self._stage("dcgm_mapping", lambda: dcgm_mapping.show(self._gpu_holders()))
            self._stage("notify", self.notifications.tick)
            self._stage("retention", self.retention.tick)
            self._stage("trim", functools.partial(trim.tick, now))
            if now >= next_reap or self.supervisor.exiting():  # an attempt's orphaned zombies hold up its end
                self._stage("reap", lambda: proctree.reap_orphans(self.supervisor.child_pids()))
            if now >= next_reap:
                self._stage("sweep", self.supervisor.sweep_cgroups)
                next_reap = now + REAP_EVERY_SECONDS
            if now >= next_status:
                self._stage("status", self._send_status)
                next_status = now + STATUS_EVERY_SECONDS
            if self.reload_requested and not self.stopping:
                exit_code = self._reload()  # returns only if it did not re-execute
                if exit_code is not None:
                    return exit_code
            if self.stopping:
                if stop_deadline is None:
                    # First, so that a daemon killed while stopping still has its jobs ended (handover).
                    self._stage("stopping_marker", functools.partial(handover.mark_stopping, self.cfg.run_dir))
                    stop_deadline = now + self.supervisor.stop_all() + 30.0
                    # STOPPING=1 as the stop begins, not once the jobs are down; the extension (renewed
                    # with each STATUS) keeps TimeoutStopSec from cutting their checkpoints off.
                    self.notifier.stopping(f"stopping: {self.supervisor.busy} jobs checkpointing")
                    self.notifier.extend_timeout(15.0)
                if not self.supervisor.busy or now > stop_deadline:
                    break
            # Only after a full turn: the watchdog's ping proves the loop turns, not just that it started.
            if now >= next_watchdog:
                self.notifier.watchdog()
                next_watchdog = now + watchdog_every
            turn += 1
            seconds = time.perf_counter() - began
            self.turn_times.add(seconds)
            # Debug only: each finished turn, so that "it did not happen" can be said after turns that had
            # the chance to do it (tests wait for these, not for seconds); its length: the scale bench's.
            log.debug("loop_turn", turn=turn, seconds=round(seconds, 6))
            moving = (self.stopping or self.reload_requested or bool(self.store_problems) or self.intake.backlog()
                      or self.retention.backlog() or not self.supervisor.settled())
            cadence.wait(self.wake, moving)
        self.shutdown()
        return 0

    def _stage(self, name: str, fn: Callable[[], object]) -> None:
        """One part of the loop's turn, contained: a store that cannot take writes now (disk full,
        locked) is shown in STATUS and retried next turn; any other error is logged (once per
        distinct error) and the loop goes on. Per-job faults are contained inside the supervisor."""
        try:
            fn()
        except StoreUnavailable as e:
            if name not in self.store_problems:
                log.error("state_store_unavailable", stage=name, error=str(e))
            self.store_problems[name] = str(e)
            return
        except Exception as e:  # noqa: BLE001 — the daemon outlives any one bug
            key = f"{name}:{type(e).__name__}:{e}"
            if key not in self._faults_logged:
                self._faults_logged.add(key)
                log.error("loop_stage_failed", stage=name, error=f"{type(e).__name__}: {e}",
                          traceback=traceback.format_exc(limit=8))
            return
        if self.store_problems.pop(name, None) is not None:
            log.info("state_store_available_again", stage=name)

    def store_problem(self) -> str | None:
        """Why the store takes no writes now, if it does not (shown in STATUS)."""
        return self.supervisor.store_problem() or next(iter(self.store_problems.values()), None)

    def _send_status(self) -> None:
        text = self.status_text()
        if self.stopping:
            text = f"stopping: {self.supervisor.busy} jobs checkpointing; " + text
            self.notifier.extend_timeout(15.0)
        self.notifier.status(text)

    def _gpu_holders(self) -> dict[int, str]:
        """GPU → the job holding it, from the supervisor's ledgers (a job that ended holds none)."""
        return {g: s.job.name for s in self.supervisor.records.values() if s.phase is not Phase.DONE
                for g in s.ledger.gpus}

    def _gpu_faults(self) -> None:
        """Fatal XIDs on GPUs of tracked jobs: the gate quarantines each GPU; the attempt on it stops
        (class gpu-fault: restarted on healthy GPUs)."""
        for gpu, detail in self.gate.faults(self.supervisor.held_gpus()):
            self.supervisor.gpu_fault(gpu, detail)

    # --- changes users asked for (the control socket's request table checked who may) --------------

    def _run_commands(self) -> None:
        while True:
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return
            try:
                cmd.reply = self._change(cmd)
            finally:
                cmd.done.set()

    def _change(self, cmd: Command) -> dict:
        target: object = cmd.name
        if REQUESTS[cmd.op].target is Target.JOB:
            job = find_job(self.store, cmd.name, cmd.uid, self.cfg.admin_group)
            if isinstance(job, dict):
                return job
            if cmd.op == "cancel" and job.state.terminal:
                return error(f"{cmd.name} already {job.state.value}")
            target = job
        try:
            return self._changes[cmd.op](target, user_name(cmd.uid), cmd.arg)
        except StoreUnavailable as e:
            return error(f"cannot record the {cmd.op} now: {e}")

    # --- stop -----------------------------------------------------------------------------------

    def request_stop(self, signum: int, _frame: object) -> None:
        if not self.stopping:
            self.stopping = True
            self.wake.put("stop")

    def request_reload(self, signum: int, _frame: object) -> None:
        self.reload_requested = True
        self.wake.put("reload")

    def shutdown(self) -> None:
        self.notifier.stopping("stopping: jobs stopped, shutting down")
        log.info("daemon_stopping", live_attempts=self.supervisor.busy)
        self._close()
        log.info("daemon_stopped")

    def _close(self) -> None:
        """Everything this process holds, except its jobs: they are stopped (shutdown) or kept (reload)."""
        self.supervisor.close()
        self.notifications.close()
        self.lanes.close()
        self.intake.stop()
        self.control.stop()
        self.adopter.stop()
        self.leases.stop()
        if self.metrics is not None:
            self.metrics.shutdown()
        if self.dcgm_mapping is not None:
            self.dcgm_mapping.close()
        self.backend.close()
        self.store.close()

    def _reload(self) -> int | None:
        """SIGHUP (reload.py): deferred while a job is between phases; refused, with this image
        running on, when the new code does not pass `--check`. Otherwise RELOADING=1, everything but
        the jobs is closed and the process execs itself. Returns an exit status only if the exec
        failed after the close (systemd then restarts the daemon; the jobs are kept)."""
        between = reload.jobs_between_phases(self.supervisor.records)
        if between:
            if between != self._reload_deferred_for:
                log.info("reload_deferred", jobs=list(between))
                self._reload_deferred_for = between
            return None
        self.reload_requested = False
        self._reload_deferred_for = ()
        argv = reload.reexec_argv()
        problem = reload.check_new_image(argv)
        if problem is not None:
            log.error("reload_refused", argv=argv, error=problem)
            self._stage("reload_refused", functools.partial(handover.mark_refused, self.cfg.run_dir, problem))
            return None
        self.notifier.reloading(f"reloading: re-executing; {self.supervisor.busy} running jobs kept")
        log.info("daemon_reexec", version=daemon_version(), argv=argv, running_jobs=self.supervisor.busy)
        self._close()
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execv(argv[0], argv)
        except OSError as e:
            log.error("reexec_failed", argv=argv, error=str(e))
        return 1
