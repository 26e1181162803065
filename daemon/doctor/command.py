"""`spx doctor [--json]` glue: a DaemonConfig → a DoctorContext → the report on stdout, exit status."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from spx.daemon.doctor.report import DoctorContext, exit_code, render_text, run_checks, to_json
from spx.daemon.gpu.backend import GpuBackend, GpuBackendError, open_backend


def open_backend_for_doctor(kind: str, fake_fixture: Path | None) -> GpuBackend:
    """Like the daemon's, but a backend that cannot open is reported, not raised."""
    try:
        return open_backend(kind, fake_fixture)
    except GpuBackendError as e:
        return GpuBackend("none", f"none: {e}", None)


def run_doctor(
    cfg: Any,
    as_json: bool = False,
    staging: Sequence[tuple[Path | None, Path]] = (),
    worker_python: str | None = None,
    out: Any = None,
    mark: Callable[[str, str], str] | None = None,
) -> int:
    """Print the report for this host and `cfg`'s paths; 1 if any check failed. `mark(text, status)`
    colours each verdict in the text report (the CLI's, on a terminal); JSON is never marked.

    Under `--root` (paths that are not the system defaults) the spool and state dirs must belong to
    the user running the daemon, not root.
    """
    from spx.daemon.core.config import DaemonConfig

    out = out or sys.stdout
    rooted = Path(cfg.spool_dir) != DaemonConfig().spool_dir
    backend = open_backend_for_doctor(cfg.gpu_backend, cfg.fake_gpus)
    try:
        ctx = DoctorContext.from_config(
            cfg, backend, staging=staging, owner_uid=os.geteuid() if rooted else 0,
            worker_python=worker_python or sys.executable,
        )
        checks = run_checks(ctx)
    finally:
        backend.close()
    out.write(json.dumps(to_json(checks), indent=1) + "\n" if as_json
              else render_text(checks, mark) if mark else render_text(checks))
    return exit_code(checks)
