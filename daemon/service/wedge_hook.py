"""A test hook (SPX_TEST_HOOKS=1): a file `run_dir/wedge-main-loop` blocks the main loop, so tests
can prove the systemd watchdog restarts a wedged daemon. One-shot (the file is removed): run_dir
outlives the restart (RuntimeDirectoryPreserve=restart). Off unless the environment asks for it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from spx.daemon.core.log import get_logger

log = get_logger()


def wedge_if_asked(run_dir: Path) -> None:
    wedge = run_dir / "wedge-main-loop"
    if os.environ.get("SPX_TEST_HOOKS") == "1" and wedge.exists():
        wedge.unlink(missing_ok=True)
        log.warning("main_loop_wedged_by_test_hook")
        while True:
            time.sleep(3600)
