"""spx-trainer: the daemon.

    spx-trainer --root ./spx-root --gpu-backend fake      # try it without root
    spx-trainer --config /etc/spx/config.yaml             # what systemd runs
    spx-trainer --config /etc/spx/config.yaml --reload PID  # ExecReload=: re-exec PID, wait for it

One main loop on one thread owns the state store: it claims spool files, schedules, supervises
attempts and answers change requests. Other threads (inotify, the control socket, the metrics
server, the XID watcher) only read or hand work to it through queues. This module never imports
torch (a test enforces it): the daemon must start fast and survive a broken CUDA install.

Jobs outlive the daemon: SIGHUP (`systemctl reload`) makes it re-execute itself in place with the
code now installed (same pid; its attempts keep running and are adopted by the new image's start),
and under systemd a crash leaves them running for the restarted daemon (handover.py).
"""

from __future__ import annotations

import argparse
import functools
import os
import queue
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from spx.daemon.core.config import ConfigError, DaemonConfig, load_config
from spx.daemon.core.lanes import Lanes
from spx.daemon.core.log import configure, get_logger
from spx.daemon.core.users import is_admin, user_name
from spx.daemon.gpu.backend import GpuBackend, XidEvent, open_backend
from spx.daemon.gpu.health import HealthGate, fatal_xid, xid_reason
from spx.daemon.intake.accept import Intake
from spx.daemon.intake.adopt import Adopter
from spx.daemon.lifecycle.record import Phase
from spx.daemon.run import cgroups, proctree, scheduler
from spx.daemon.run.lease_keeper import LeaseKeeper
from spx.daemon.run.supervisor import Supervisor
from spx.daemon.service import handover
from spx.daemon.service.control import Command, ControlServer
from spx.daemon.service.gpu_rows import gpu_rows
from spx.daemon.service.queue_control import QUEUE_OPS, QueueControl
from spx.daemon.service.sd_notify import Notifier
from spx.daemon.service.status_line import format_status
from spx.daemon.state import integrity, jobviews
from spx.daemon.state.backup import Backups
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store, StoreUnavailable

log = get_logger()
TICK_SECONDS = 0.25
REAP_EVERY_SECONDS = 2.0
STATUS_EVERY_SECONDS = 2.0
GATE_PASS_SECONDS = 2.0  # a GPU that passed the health gate is not asked again for this long
# The reload waiter's patience: under systemd's default 90 s TimeoutStartSec, which bounds ExecReload=.
RELOAD_WAIT_SECONDS = 85.0
# Phases a re-exec may leave a job in: nothing of it is in flight on the loop's pool or in a stop, so
# the new image's recover() takes it on exactly (an attempt running, a backoff, a wait for GPUs).
REEXEC_SAFE = {Phase.RUNNING, Phase.BACKOFF, Phase.READY, Phase.DONE}


def _version() -> str:
    try:
        return version("spx-trainer")
    except PackageNotFoundError:
        return "0+unknown"


class Daemon:
    def __init__(self, cfg: DaemonConfig, backend: GpuBackend, notifier: Notifier,
                 cgroup_tree: cgroups.CgroupTree | None = None):
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
        # Work done on users' behalf off the loop, fair by owner (core.lanes); answers come back in `tick`.
        self.lanes = Lanes(cfg.user_work.slots_total, cfg.user_work.slots_per_owner, lambda: self.wake.put("slow"))
        self.supervisor = Supervisor(cfg, self.store, cgroup_tree=cgroup_tree, wake=lambda: self.wake.put("slow"),
                                     gpu_computing=backend.computing, lanes=self.lanes)
        self.store_problems: dict[str, str] = {}  # loop stage → the store's refusal (disk full, locked)
        self._faults_logged: set[str] = set()
        self.intake = Intake(cfg, self.store, self.wake)
        self.adopter = Adopter(cfg, self.store, self.intake, lambda: self.wake.put("adopt"))  # host loss
        self.leases = LeaseKeeper(cfg, self.store)
        self.control = ControlServer(cfg.socket_path, self._answer, self.commands, self.wake)
        self.metrics = None
        self.health = HealthGate(backend)
        self._gate_passed: dict[int, float] = {}  # GPU → when it last passed the health gate (monotonic)
        self.xid_events: queue.SimpleQueue[XidEvent] = queue.SimpleQueue()
        self.quarantined = self.store.quarantined_gpus()  # the main loop's copy; it writes the table
        self._waiting_reasons: dict[int, str] = {}
        self.queue = QueueControl(cfg, self.store)  # hold/release/priority/drain, and the queue's rules

    def _prepare_dirs(self) -> None:
        for d in (self.cfg.state_dir, self.cfg.log_dir, self.cfg.run_dir, self.cfg.checkpoints_root):
            d.mkdir(parents=True, exist_ok=True)
        self.cfg.state_dir.chmod(0o700)
        if not self.cfg.spool_dir.exists():
            self.cfg.spool_dir.mkdir(parents=True)
            # Sticky, writable by all, not listable: users can drop but not see or touch others' files.
            self.cfg.spool_dir.chmod(0o1733)

    # --- GPUs -----------------------------------------------------------------------------------

    def _gpu_idle(self, g: int) -> bool:
        """No compute process on GPU g (from anything) and healthy: it passes the health gate
        (gpu/health.py) — one that fails it is quarantined here, before an attempt starts on it."""
        if not self.backend.healthy(g):
            why = self.health.check(g)  # lost (off the bus, needs a reset): quarantined; else just not free
            if why is not None:
                self._quarantine(g, why)
            return False
        pids = self.backend.compute_pids(g)
        if pids is None or pids:
            return False
        now = time.monotonic()
        if now - self._gate_passed.get(g, -GATE_PASS_SECONDS) < GATE_PASS_SECONDS:
            return True
        why = self.health.check(g)
        if why is not None:
            self._quarantine(g, why)
            return False
        self._gate_passed[g] = now
        return True

    def _quarantine(self, g: int, reason: str) -> None:
        """Record GPU g as faulty: the scheduler never allocates it again until released. A store that
        cannot take the write now (disk full) does not stop it: this daemon keeps it in memory."""
        if g in self.quarantined:
            return
        uuid = next((d.uuid for d in self.backend.devices() if d.index == g), None)
        now = time.time()
        self.quarantined[g] = (uuid, reason, now)
        log.error("gpu_quarantined", gpu=g, uuid=uuid, reason=reason)
        try:
            self.store.quarantine_gpu(g, uuid, reason, now)
        except StoreUnavailable as e:
            log.error("gpu_quarantine_not_stored", gpu=g, error=str(e))

    def _on_xid(self, event: XidEvent) -> None:
        """The XID thread's listener: only enqueues (the main loop acts in `_gpu_faults`)."""
        if fatal_xid(event.xid) is not None:
            self.xid_events.put(event)
            self.wake.put("xid")

    def _gpu_faults(self) -> None:
        """Fatal XIDs on a GPU a tracked job holds: the GPU is quarantined and an attempt running on it
        stopped (class gpu-fault: restarted on healthy GPUs; a job between attempts is placed again).
        A fatal XID on a GPU no job holds is left to the gate's state checks (a GPU off the bus is
        lost to NVML too)."""
        while True:
            try:
                event = self.xid_events.get_nowait()
            except queue.Empty:
                return
            detail = xid_reason(event.gpu, event.xid)
            if event.gpu not in self.supervisor.held_gpus():
                log.info("gpu_fatal_xid_idle", gpu=event.gpu, xid=event.xid, detail=detail)
                continue
            self._quarantine(event.gpu, detail)
            self.supervisor.gpu_fault(event.gpu, detail)  # stops an attempt running on it

    # --- the loop -------------------------------------------------------------------------------

    def start(self) -> None:
        from spx.daemon.exporter.server import build_registry, serve

        proctree.become_subreaper()
        for job in self.store.fail_unusable_specs(time.time()):
            log.error("job_spec_invalid_after_upgrade", job=job.name, reason=job.spec_problem)
        handover.clear_stopping(self.cfg.run_dir)
        self.supervisor.recover()
        self.supervisor.sweep_cgroups()
        self.intake.start()
        self.leases.start()
        self.adopter.start()
        self.control.start()
        self.backend.start_xid_watch(self._on_xid)  # before the thread starts: no XID goes unheard
        registry = build_registry(self.backend, self.views, _version(), job_labels=self.cfg.metrics_job_labels,
                                  quarantined=self.store.quarantined_gpus, drained=self.store.drained)
        metrics = self.metrics = serve(registry, self.cfg.metrics_address)
        host = self.cfg.metrics_address.rsplit(":", 1)[0]
        log.info("daemon_ready", version=_version(), root=str(self.cfg.spool_dir.parent),
                 gpu_backend=self.backend.description, metrics=f"{host}:{metrics.port}",
                 spool=str(self.cfg.spool_dir), pid=os.getpid(), adopted=self.supervisor.adopted)
        handover.mark_ready(self.cfg.run_dir, _version(), self.supervisor.adopted)
        self.notifier.ready(self.status_text())

    def views(self):
        return jobviews.all_views(self.store, self.cfg.run_dir, self.supervisor.live_pids)

    def status_text(self) -> str:
        live = jobviews.all_views(self.store, self.cfg.run_dir, scope="live")
        return format_status(live, len(self.backend.devices()), self.supervisor.last_restart, time.time(),
                             self.store_problem(), adopted=self.supervisor.adopted, drained=self.queue.drained)

    def run(self) -> int:
        self.start()
        next_reap = next_status = 0.0
        stop_deadline = None
        watchdog_every = self.notifier.watchdog_interval or 5.0
        next_watchdog = 0.0
        while True:
            now = time.monotonic()
            self._test_wedge_hook()
            self._stage("backup", functools.partial(self.backups.tick, now))
            self._stage("intake", functools.partial(self.intake.claim_due, now))
            self._stage("commands", self._run_commands)
            self._stage("adopt", self.adopter.drain)
            self._stage("gpu_faults", self._gpu_faults)
            self._stage("supervise", self.supervisor.tick)
            if not self.stopping:
                self._stage("schedule", self._schedule)
            if now >= next_reap:
                self._stage("reap", lambda: proctree.reap_orphans(self.supervisor.child_pids()))
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
            try:
                self.wake.get(timeout=TICK_SECONDS)
            except queue.Empty:
                pass
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

    def _test_wedge_hook(self) -> None:
        """Test hook (SPX_TEST_HOOKS=1): a file `run_dir/wedge-main-loop` blocks the loop, so tests
        can prove the systemd watchdog restarts a wedged daemon. One-shot (the file is removed):
        run_dir outlives the restart (RuntimeDirectoryPreserve=restart)."""
        wedge = self.cfg.run_dir / "wedge-main-loop"
        if os.environ.get("SPX_TEST_HOOKS") == "1" and wedge.exists():
            wedge.unlink(missing_ok=True)
            log.warning("main_loop_wedged_by_test_hook")
            while True:
                time.sleep(3600)

    def _schedule(self) -> None:
        """Ask the scheduler (the one place that decides) what starts now, and start it."""
        live = self.store.live_jobs()
        tracked = self.supervisor.tracked()
        queued = [j for j in live if j.state is JobState.QUEUED and j.id not in tracked]
        waiting = self.supervisor.waiting()
        if not queued and not waiting:  # asking NVML which GPUs are idle costs calls on every GPU
            return
        held = {g for j in live if j.state.holds_gpus for g in j.gpus} | self.supervisor.held_gpus()
        idle = functools.cache(self._gpu_idle)
        facts = self.queue.facts(live, queued, time.monotonic()) if queued else None
        plan = scheduler.plan(queued, waiting, [d.index for d in self.backend.devices()], held, idle,
                              self.backend.description, quarantined=frozenset(self.quarantined), facts=facts)
        changed = {i: why for i, why in plan.waiting.items() if self._waiting_reasons.get(i) != why}
        if changed:  # said once per change, not every turn
            self.store.set_reasons(changed, time.time())
        names = {j.id: j.name for j in queued} if changed else {}
        for job_id, why in changed.items():
            if job_id in self.supervisor.jobs:
                log.warning("relaunch_waiting", job=self.supervisor.jobs[job_id].name, attempt=None, reason=why)
            else:
                log.debug("job_waiting", job=names.get(job_id), attempt=None, reason=why)
        self._waiting_reasons = dict(plan.waiting)
        for imp in plan.impossible:
            self.store.transition(imp.job.id, JobState.FAILED, imp.reason, time.time())
            log.error("job_cannot_run", job=imp.job.name, attempt=None, reason=imp.reason)
        for start in plan.starts:
            self.supervisor.start(start)

    # --- requests -------------------------------------------------------------------------------

    def _answer(self, op: str, name: str | None, uid: int) -> dict:
        """Read requests from the control socket (its own thread, its own store connection)."""
        admin = is_admin(uid, self.cfg.admin_group)
        if op == "adopt":  # slow (a walk of the volume): on this client's thread; drain() records
            return self.adopter.request(name, uid)
        if op == "queue":
            return self.queue.answer()
        pids = self.supervisor.live_pids()
        if op == "gpus":
            # The daemon's own backend and allocation (what `spx top` shows); the job on a GPU is
            # named only to its owner and admins, as in `ls`.
            live = jobviews.all_views(self.store, self.cfg.run_dir, scope="live")
            rows = gpu_rows(self.backend, live, self.store.quarantined_gpus())
            seen = {v.name for v in live if admin or v.owner_uid == uid}
            return {"ok": True, "result": [
                {**r.to_json(), "job": r.job if r.job is None or r.job in seen else "(another user's job)"} for r in rows]}
        if op in ("ls", "history"):
            views = jobviews.all_views(self.store, self.cfg.run_dir, lambda: pids, scope="all" if op == "history" else "recent")
            docs = [v.to_json() for v in views if admin or v.owner_uid == uid]
            return {"ok": True, "result": docs}
        job = self.store.job_by_name(name or "")
        if job is None or not (admin or job.owner_uid == uid):
            return {"ok": False, "error": f"no job named {name!r}", "code": 1}
        view = jobviews.job_view(self.store, job, self.cfg.run_dir, pids, with_history=True,
                                 gang_hosts=self.supervisor.gang_hosts(job.id))
        return {"ok": True, "result": view.to_json(with_history=True)}

    def _run_commands(self) -> None:
        while True:
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return
            if cmd.op == "gpu-release":
                cmd.reply = self._release(cmd)
                cmd.done.set()
                continue
            if cmd.op in QUEUE_OPS:
                cmd.reply = self.queue.command(cmd)
                cmd.done.set()
                continue
            job = self.store.job_by_name(cmd.name)
            if job is None or not (is_admin(cmd.uid, self.cfg.admin_group) or job.owner_uid == cmd.uid):
                cmd.reply = {"ok": False, "error": f"no job named {cmd.name!r}", "code": 1}
            elif job.state.terminal:
                cmd.reply = {"ok": False, "error": f"{cmd.name} already {job.state.value}", "code": 1}
            else:
                by = user_name(cmd.uid)
                try:
                    cmd.reply = {"ok": True, "result": self.supervisor.cancel(job, by)}
                except StoreUnavailable as e:
                    cmd.reply = {"ok": False, "error": f"cannot record the cancel now: {e}", "code": 1}
            cmd.done.set()

    def _release(self, cmd: Command) -> dict:
        """`spx gpu release N` (root or the admin group): the GPU may be allocated again."""
        if not is_admin(cmd.uid, self.cfg.admin_group):
            return {"ok": False, "error": "releasing a GPU needs root or the admin group", "code": 1}
        try:
            g = int(cmd.name)
        except ValueError:
            return {"ok": False, "error": f"not a GPU index: {cmd.name!r}", "code": 2}
        by = user_name(cmd.uid)
        try:
            released = self.store.release_gpu(g, by, time.time())
        except StoreUnavailable as e:
            return {"ok": False, "error": f"cannot record the release now: {e}", "code": 1}
        if not released:
            return {"ok": False, "error": f"GPU {g} is not quarantined", "code": 1}
        self.quarantined.pop(g, None)
        self._gate_passed.pop(g, None)
        log.info("gpu_released", gpu=g, by=by)
        return {"ok": True, "result": f"GPU {g} released"}

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
        self.lanes.close()
        self.intake.stop()
        self.control.stop()
        self.adopter.stop()
        self.leases.stop()
        if self.metrics is not None:
            self.metrics.shutdown()
        self.backend.close()
        self.store.close()

    # --- reload: re-execute in place ---------------------------------------------------------------------

    def _reload(self) -> int | None:
        """SIGHUP: become the code now installed, keeping the jobs. Deferred while a job is between
        phases (its attempt preparing, stopping or being diagnosed, its data staging: work of this
        image that the next could not take over); refused, with this image running on, when the new
        code does not pass `--check`. Otherwise RELOADING=1, everything but the jobs is closed and
        the process execs itself; the new image's start adopts the running attempts (its own
        children still: same pid) and sends READY=1. Returns an exit status only if the exec failed
        after the close (systemd then restarts the daemon; the jobs are kept)."""
        between = tuple(sorted(f"{s.job.name}: {s.phase.value}" for s in self.supervisor.records.values()
                               if s.phase not in REEXEC_SAFE))
        if between:
            if between != self._reload_deferred_for:
                log.info("reload_deferred", jobs=list(between))
                self._reload_deferred_for = between
            return None
        self.reload_requested = False
        self._reload_deferred_for = ()
        argv = reexec_argv()
        problem = check_new_image(argv)
        if problem is not None:
            log.error("reload_refused", argv=argv, error=problem)
            self._stage("reload_refused", functools.partial(handover.mark_refused, self.cfg.run_dir, problem))
            return None
        self.notifier.reloading(f"reloading: re-executing; {self.supervisor.busy} running jobs kept")
        log.info("daemon_reexec", version=_version(), argv=argv, running_jobs=self.supervisor.busy)
        self._close()
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execv(argv[0], argv)
        except OSError as e:
            log.error("reexec_failed", argv=argv, error=str(e))
        return 1


def reexec_argv() -> list[str]:
    """This process's command line, to exec again: the entry-point script itself when it was run as
    one (its #! line then names the interpreter of the install now in place), else the interpreter
    with its original arguments (`python -m spx.daemon.service.main ...`)."""
    script = sys.argv[0]
    if os.path.isabs(script) and not script.endswith(".py") and os.access(script, os.X_OK):
        return [script, *sys.argv[1:]]
    return [sys.executable, *sys.orig_argv[1:]]


def check_new_image(argv: list[str]) -> str | None:
    """Run the installed code with `--check` (it imports the daemon and loads the config): why a
    re-exec into it would fail, or None."""
    try:
        r = subprocess.run([*argv, "--check"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=60, close_fds=True)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{argv[0]} --check: {e}"
    if r.returncode != 0:
        return f"{argv[0]} --check exited {r.returncode}: {(r.stderr or r.stdout).strip()[-500:]}"
    return None



def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="spx-trainer", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--config", type=Path, help="config file (default /etc/spx/config.yaml if it exists)")
    p.add_argument("--root", type=Path, help="put spool, state, log, checkpoints and run dirs under DIR")
    p.add_argument("--gpu-backend", choices=["auto", "nvml", "fake", "none"])
    p.add_argument("--fake-gpus", type=Path, help="fixture for --gpu-backend fake")
    p.add_argument("--metrics-address", help="HOST:PORT for /metrics (default 127.0.0.1:9101)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    once = p.add_mutually_exclusive_group()
    once.add_argument("--check", action="store_true",
                      help="load the config and exit (0: this code and config start); a reload runs it first")
    once.add_argument("--reload", type=int, metavar="PID",
                      help="(ExecReload=) make daemon PID re-execute itself; wait until it did (or refused)")
    once.add_argument("--stop-post", action="store_true",
                      help="(ExecStopPost=) after a stop, kill what is left in the unit's cgroup; after a "
                           "crash ($SERVICE_RESULT), leave the jobs running for the next start to adopt")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure(args.log_level)
    if args.stop_post or args.reload is not None or args.check:
        return _helper(args)
    # Until the daemon exists: a stop is remembered (its jobs, adopted or not, still get their grace),
    # and a reload is already done (this start runs the code installed now; it writes daemon.ready).
    early_stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: early_stop.append(signum))
    signal.signal(signal.SIGINT, lambda signum, _frame: early_stop.append(signum))
    signal.signal(signal.SIGHUP, lambda _signum, _frame: None)
    try:
        cfg = load_config(args.config, args.root, gpu_backend=args.gpu_backend, fake_gpus=args.fake_gpus,
                          metrics_address=args.metrics_address)
        backend = open_backend(cfg.gpu_backend, cfg.fake_gpus, fake_scope=cfg.run_dir)
        # Before any thread starts: the daemon moves itself into its supervisor leaf here.
        cgroup_tree, why = cgroups.manage_own(cfg.cgroups)
    except (ConfigError, RuntimeError, cgroups.CgroupError) as e:
        log.error("cannot_start", error=str(e))
        return 2
    try:
        # Before anything opens the store: one daemon per state dir, and a damaged store is refused.
        integrity.lock_state_dir(cfg.state_dir)  # the fd stays open (and locked) until the process exits
        integrity.check_store(cfg.store_path, cfg.backup_dir)
    except integrity.StoreRefused as e:
        log.error("state_store_refused", error=str(e))
        return e.exit_code
    log.info("cgroups", managed=cgroup_tree is not None, cgroup=str(cgroup_tree.root) if cgroup_tree else None,
             reason=why)
    if backend.kind == "none":
        log.warning("no_gpus", detail=backend.description + "; only CPU jobs (gpus: 0) will run")
    daemon = Daemon(cfg, backend, Notifier.from_env(), cgroup_tree)
    signal.signal(signal.SIGTERM, daemon.request_stop)
    signal.signal(signal.SIGINT, daemon.request_stop)
    signal.signal(signal.SIGHUP, daemon.request_reload)
    if early_stop:
        daemon.request_stop(early_stop[0], None)
    return daemon.run()


def _helper(args: argparse.Namespace) -> int:
    """The one-shot modes: --check, and the unit's ExecReload= and ExecStopPost= commands."""
    try:
        cfg = load_config(args.config, args.root, gpu_backend=args.gpu_backend, fake_gpus=args.fake_gpus,
                          metrics_address=args.metrics_address)
    except ConfigError as e:
        log.error("cannot_start", error=str(e))
        if args.stop_post:  # the stop guard runs whatever the config says: it needs only its cgroup
            return handover.stop_post(None, os.environ.get("SERVICE_RESULT", ""))
        return 2
    if args.stop_post:
        return handover.stop_post(cfg.run_dir, os.environ.get("SERVICE_RESULT", ""))
    if args.reload is not None:
        done, what = handover.request_reload(cfg.run_dir, args.reload, RELOAD_WAIT_SECONDS)
        (log.info if done else log.error)("reload_done" if done else "reload_failed", detail=what)
        return 0 if done else 1
    log.info("check_ok", version=_version(), config=str(args.config) if args.config else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
