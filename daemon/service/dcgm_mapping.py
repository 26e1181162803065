"""dcgm-exporter's job mapping: which spx job holds each GPU, in the files dcgm-exporter reads.

dcgm-exporter started with `--hpc-job-mapping-dir DIR` reads, on every scrape, each file in DIR whose
name is a GPU index and labels that GPU's series `hpc_job` with each line of the file. A host that
runs dcgm-exporter next to spx-trainer then sees spx jobs on its existing DCGM dashboards. With config
`metrics: {dcgm_job_mapping_dir: DIR}` the daemon keeps DIR true to its own ledger: one file per GPU a
job holds (starting, running, stopping, or waiting on its GPUs between attempts), named by the GPU's
index and holding the job's name (the value of `spx_job` on the daemon's own series, so the two join),
and no file for a GPU no job holds.

The loop only shows the writer the mapping (a dict compare per turn); a writer thread writes it, so a slow or
dead filesystem never holds the loop, and only the newest mapping is ever written. Each write makes the
directory a root-owned 0755 one first (fsafe.open_root_dir: anything else at its name is moved aside;
the daemon's start checked that only root can write above it), then replaces a changed file by a temp file and
a rename in that directory's fd (dcgm-exporter never reads half a file: it skips names that are not
numbers), and removes the files of GPUs no job holds, and nothing else. Files stay on a daemon crash
(its jobs keep running and are adopted) and are made right by the next start's first write.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from spx.daemon.core.log import get_logger
from spx.daemon.userfs import fsafe

log = get_logger()
DIR_MODE = 0o755   # dcgm-exporter may run as its own user: it must list and read
FILE_MODE = 0o644
TEMP_SUFFIX = ".spx-tmp"
RETRY_SECONDS = 5.0
CLOSE_SECONDS = 5.0

# GPU index → the names of the jobs on it (one, as spx gives a GPU to one job at a time).
Holders = Mapping[int, tuple[str, ...]]


def mapping_files(holders: Holders) -> dict[str, bytes]:
    """The directory's contents for `holders`: file name (the GPU index) → one job name a line."""
    return {str(gpu): "".join(f"{name}\n" for name in names).encode() for gpu, names in holders.items() if names}


def _is_gpu_file(name: str) -> bool:
    return name.isascii() and name.isdigit()


def sync_dir(directory: Path, holders: Holders) -> None:
    """Make `directory` hold exactly `holders`' mapping files: changed ones replaced, those of GPUs no
    job holds removed (and temp files a crash left); other files are left alone."""
    wanted = mapping_files(holders)
    dir_fd = fsafe.open_root_dir(directory, DIR_MODE)
    try:
        present = set(os.listdir(dir_fd))
        for name, content in sorted(wanted.items()):
            if name not in present or _content(dir_fd, name) != content:
                _replace(dir_fd, name, content)
        for name in present:
            if (_is_gpu_file(name) and name not in wanted) or (name.startswith(".") and name.endswith(TEMP_SUFFIX)):
                _unlink(dir_fd, name)
    finally:
        os.close(dir_fd)


def _content(dir_fd: int, name: str) -> bytes | None:
    try:
        return fsafe.read_at(dir_fd, name, cap=4096)
    except OSError:
        return None  # not a regular file, or unreadable: replaced


def _replace(dir_fd: int, name: str, content: bytes) -> None:
    temp = f".{name}{TEMP_SUFFIX}"
    _unlink(dir_fd, temp)
    fd = fsafe.create_excl(dir_fd, temp, FILE_MODE)
    try:
        fsafe.write_all(fd, content)
    finally:
        os.close(fd)
    os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _unlink(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


class DcgmJobMapping:
    """The writer of one mapping directory: `show` from the loop, the writes on its own thread."""

    def __init__(self, directory: Path, sync: Callable[[Path, Holders], None] = sync_dir,
                 retry_seconds: float = RETRY_SECONDS) -> None:
        self.directory = directory
        self._sync = sync
        self._retry_seconds = retry_seconds
        self._shown: dict[int, tuple[str, ...]] | None = None  # the loop's: the last mapping handed over
        self._cond = threading.Condition()
        self._wanted: dict[int, tuple[str, ...]] | None = None  # handed over, not yet taken by the writer
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="spx-dcgm-mapping", daemon=True)
        self._thread.start()

    def show(self, holders: Mapping[int, str]) -> None:
        """GPU index → the name of the job holding it, as the loop knows it now. Never waits on a write:
        a changed mapping replaces any the writer has not taken yet."""
        mapping: dict[int, tuple[str, ...]] = {gpu: (name,) for gpu, name in holders.items()}
        if mapping == self._shown:
            return
        self._shown = mapping
        with self._cond:
            self._wanted = mapping
            self._cond.notify()

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """Write the last mapping shown (after a stop: no job holds a GPU, so no file), then end the
        writer; a write still blocked after `timeout` is left to its (daemon) thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        failed: dict[int, tuple[str, ...]] | None = None  # a mapping whose write failed: retried
        last_error: str | None = None
        while True:
            with self._cond:
                if self._wanted is None and not self._closing:
                    self._cond.wait(None if failed is None else self._retry_seconds)
                mapping = self._wanted if self._wanted is not None else failed  # the newest, else the retry
                self._wanted = None
                closing = self._closing
            if mapping is not None:
                last_error = self._write(mapping, last_error)
                failed = mapping if last_error is not None else None
            if closing:
                return

    def _write(self, mapping: dict[int, tuple[str, ...]], last_error: str | None) -> str | None:
        """Write `mapping`; the error if it failed (logged once until a write succeeds), else None."""
        try:
            self._sync(self.directory, mapping)
        except Exception as e:  # noqa: BLE001 — the mapping is retried; the daemon goes on
            error = f"{type(e).__name__}: {e}"
            if error != last_error:
                log.warning("dcgm_job_mapping_failed", dir=str(self.directory), error=error,
                            retry_seconds=self._retry_seconds)
            return error
        if last_error is not None:
            log.info("dcgm_job_mapping_written_again", dir=str(self.directory))
        log.debug("dcgm_job_mapping_written", dir=str(self.directory),
                  gpus={str(gpu): list(names) for gpu, names in sorted(mapping.items())})
        return None
