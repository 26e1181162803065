"""spx-trainer: the daemon.

    spx-trainer --root ./spx-root --gpu-backend fake      # try it without root
    spx-trainer --config /etc/spx/config.yaml             # what systemd runs
    spx-trainer --config /etc/spx/config.yaml --reload PID  # ExecReload=: re-exec PID, wait for it

This module is the command: its flags, its one-shot modes (the unit's --check, --reload and
--stop-post), and the start-up that must happen before the loop exists (config, GPU backend, the
daemon's own cgroup, the state store's lock and check). The loop itself is daemon.py. Nothing here
imports torch (a test enforces it): the daemon must start fast and survive a broken CUDA install.

Jobs outlive the daemon: SIGHUP (`systemctl reload`) makes it re-execute itself in place with the
code now installed (same pid; its attempts keep running and are adopted by the new image's start),
and under systemd a crash leaves them running for the restarted daemon (handover.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from spx.daemon.core.config import ConfigError, load_config
from spx.daemon.core.log import configure, get_logger
from spx.daemon.core.malloc_arenas import cap_arenas, fix_mmap_threshold
from spx.daemon.core.users import log_access
from spx.daemon.core.version import daemon_version
from spx.daemon.gpu.backend import open_backend
from spx.daemon.run import cgroups
from spx.daemon.service import handover
from spx.daemon.service.daemon import Daemon, StartError
from spx.daemon.service.sd_notify import Notifier
from spx.daemon.state import integrity

log = get_logger()
# The reload waiter's patience: under systemd's default 90 s TimeoutStartSec, which bounds ExecReload=.
RELOAD_WAIT_SECONDS = 85.0


def build_parser() -> argparse.ArgumentParser:
    """spx-trainer's flags (also what its man page and shell completion are generated from)."""
    p = argparse.ArgumentParser(prog="spx-trainer", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--version", action="version", version=f"spx-trainer {daemon_version()}")
    p.add_argument("--config", type=Path, metavar="FILE", help="config file (default /etc/spx/config.yaml if it exists)")
    p.add_argument("--root", type=Path, metavar="DIR", help="put spool, state, log, checkpoints and run dirs under DIR")
    p.add_argument("--gpu-backend", choices=["auto", "nvml", "fake", "none"],
                   help="where GPUs come from: NVML (auto: when a driver answers), a fake fixture, or none "
                        "(CPU jobs only); overrides the config's gpu_backend")
    p.add_argument("--fake-gpus", type=Path, metavar="FILE", help="fixture for --gpu-backend fake")
    p.add_argument("--metrics-address", metavar="HOST:PORT", help="HOST:PORT for /metrics (default 127.0.0.1:9101)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="the lowest level logged (default info)")
    once = p.add_mutually_exclusive_group()
    once.add_argument("--check", action="store_true",
                      help="load the config and exit (0: this code and config start); a reload runs it first")
    once.add_argument("--reload", type=int, metavar="PID",
                      help="(ExecReload=) make daemon PID re-execute itself; wait until it did (or refused)")
    once.add_argument("--stop-post", action="store_true",
                      help="(ExecStopPost=) after a stop, kill what is left in the unit's cgroup; after a "
                           "crash ($SERVICE_RESULT), leave the jobs running for the next start to adopt")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    arena_cap = cap_arenas()  # before any thread starts (core/malloc_arenas.py)
    mmap_threshold = fix_mmap_threshold()
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
        cfg.check_host()
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
    log.info("malloc_arenas", cap=arena_cap, mmap_threshold=mmap_threshold)
    log.info("cgroups", managed=cgroup_tree is not None, cgroup=str(cgroup_tree.root) if cgroup_tree else None,
             reason=why)
    if backend.kind == "none":
        log.warning("no_gpus", detail=backend.description + "; only CPU jobs (gpus: 0) will run")
    if cfg.log_group and not log_access(0, cfg.log_group).group_reads:
        log.warning("log_group_missing", log_group=cfg.log_group,
                    detail="no such group: job logs are readable by their owners alone")
    daemon = Daemon(cfg, backend, Notifier.from_env(), cgroup_tree, why)
    install_signal_handlers(daemon, early_stop)
    try:
        return daemon.run()
    except StartError as e:
        log.error("cannot_start", error=str(e))
        daemon.shutdown()
        return 2


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
    try:
        cfg.check_host()
    except ConfigError as e:
        log.error("cannot_start", error=str(e))
        return 2
    log.info("check_ok", version=daemon_version(), config=str(args.config) if args.config else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def install_signal_handlers(daemon: Daemon, early_stop: list[int]) -> None:
    """SIGTERM/SIGINT stop, SIGHUP reloads; a stop that came before the daemon existed is honoured."""
    signal.signal(signal.SIGTERM, daemon.request_stop)
    signal.signal(signal.SIGINT, daemon.request_stop)
    signal.signal(signal.SIGHUP, daemon.request_reload)
    if early_stop:
        daemon.request_stop(early_stop[0], None)
