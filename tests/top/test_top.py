"""spx top: the pure layout, fresh GPU rows from the fake NVML, and the redraw loop on a real pty."""

from __future__ import annotations

import io
import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from spx.daemon.cli.top import (
    CLEAR_BELOW,
    HIDE_CURSOR,
    HOME,
    SHOW_CURSOR,
    age,
    gpu_list,
    render,
    run_top,
)
from spx.daemon.cli.top_command import job_from_json
from spx.daemon.gpu.backend import open_backend
from spx.daemon.service.gpu_rows import GpuRow, gpu_rows
from spx.daemon.state.views import JobView

NOW = 1_800_000_000.0
STAGING = "staging 412.0 MiB / 1.0 GiB (40%), 310/1000 files, 85.2 MiB/s"


def job(name: str, state: str, **kw) -> JobView:
    base = dict(reason=None, owner_uid=1000, owner="alice", attempts=1, step=None, epoch=None,
                samples_per_second=None, last_checkpoint_step=None, last_checkpoint_time=None, gpus=[],
                submitted=NOW - 600)
    return JobView(name=name, state=state, **{**base, **kw})


JOBS = [
    job("llama-ft", "running", attempts=3, step=12400, samples_per_second=1024.53, last_checkpoint_step=12000,
        last_checkpoint_time=NOW - 252, gpus=[0, 1, 2, 3], restarts_by_reason={"crash": 1, "hang": 1}),
    job("bert", "starting", gpus=[4, 5], staging=STAGING),
    job("old", "failed", attempts=4, reason="crash loop: 3 attempts without step progress"),
]
GPUS = [
    GpuRow(0, "NVIDIA H100 80GB HBM3", 97, 61 << 30, 80 << 30, 612.4, "llama-ft"),
    GpuRow(1, "NVIDIA H100 80GB HBM3", None, None, None, None, "llama-ft"),
]


def test_helpers() -> None:
    assert [age(s) for s in (None, 5, 252, 7300, 90000)] == ["", "5s", "4m12s", "2h01m", "1d01h"]
    assert gpu_list([0, 1, 2, 3, 6, 8, 9]) == "0-3,6,8-9"
    assert gpu_list([]) == ""


def test_render_wide_has_every_column_and_the_notes_inline() -> None:
    text = render(JOBS, GPUS, NOW, 160)
    lines = text.splitlines()
    assert "1 failed, 1 running, 1 starting" in lines[0] and "2 GPUs, 2 allocated" in lines[0]
    header = lines[2]
    for col in ("JOB", "STATE", "STEP", "SAMPLES/S", "LAST CKPT", "RESTARTS", "GPUS", "NOTE"):
        assert col in header
    llama = next(x for x in lines if x.startswith("llama-ft"))
    for cell in ("running", "12,400", "1,024.5", "4m12s (step 12000)", "0-3"):
        assert cell in llama
    assert llama.split()[-2] == "2"  # restarts: 1 crash + 1 hang
    assert next(x for x in lines if x.startswith("bert")).endswith(STAGING)
    assert lines.index(next(x for x in lines if x.startswith("bert"))) < lines.index(llama)  # active first
    gpu0 = next(x for x in lines if x.lstrip().startswith("0  H100"))
    for cell in ("97%", "61.0/80.0 GiB", "612 W", "llama-ft"):
        assert cell in gpu0
    gpu1 = next(x for x in lines if x.lstrip().startswith("1  H100"))
    assert gpu1.split() == ["1", "H100", "80GB", "HBM3", "llama-ft"]  # NVML gave nothing: blank cells


@pytest.mark.parametrize("width", [60, 80, 100])
def test_render_narrow_fits_and_moves_notes_under_their_job(width: int) -> None:
    lines = render(JOBS, GPUS, NOW, width).splitlines()
    assert all(len(x) <= width for x in lines)
    if width < 100:
        bert = next(i for i, x in enumerate(lines) if x.startswith("bert"))
        assert lines[bert + 1].startswith("  └ staging 412.0 MiB")


def test_render_without_jobs_or_gpus() -> None:
    text = render([], [], NOW, 80)
    assert "no jobs" in text.splitlines()[0] and "no GPUs" in text.splitlines()[0] and "(no jobs)" in text


def test_gpu_rows_from_the_fake_backend_are_fresh_and_errors_are_blank() -> None:
    with open_backend("fake") as b:
        rows = gpu_rows(b, JOBS)
        assert [r.index for r in rows] == list(range(8))
        assert [r.job for r in rows] == ["llama-ft"] * 4 + ["bert"] * 2 + [None, None]
        assert all(r.memory_total and r.memory_used is not None and r.power_watts and r.utilization is not None
                   for r in rows)
        calls = b.nvml.calls["nvmlDeviceGetPowerUsage"]
        gpu_rows(b, JOBS)
        assert b.nvml.calls["nvmlDeviceGetPowerUsage"] == calls + 8  # read again, not cached
        b.nvml.fail_gpu(2)
        b.nvml.fail_function("nvmlDeviceGetPowerUsage", index=5)
        rows = gpu_rows(b, JOBS)
    assert (rows[2].utilization, rows[2].memory_used, rows[2].power_watts) == (None, None, None)
    assert rows[2].job == "llama-ft" and rows[2].name.startswith("NVIDIA H100")
    assert rows[5].power_watts is None and rows[5].utilization is not None


def test_gpu_rows_without_gpus() -> None:
    with open_backend("none") as b:
        assert gpu_rows(b, JOBS) == []


def test_job_views_round_trip_through_ls_json() -> None:
    for j in JOBS:
        assert job_from_json({**j.to_json(), "unexpected": 1}) == j


def test_not_a_terminal_prints_one_plain_frame() -> None:
    out = io.StringIO()
    assert run_top(lambda: (JOBS, GPUS), 0.1, out, clock=lambda: NOW) == 0
    assert "\x1b" not in out.getvalue() and "llama-ft" in out.getvalue()


def _read_pty(fd: int, until: bytes, timeout: float = 60.0) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout
    while until not in buf and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                buf += os.read(fd, 65536)
            except OSError:
                break
    return buf


def test_live_view_redraws_in_place_on_a_terminal_and_shows_fetch_errors() -> None:
    master, slave = os.openpty()
    out = open(slave, "w")  # noqa: SIM115 - a real tty for run_top
    results = iter([(JOBS, GPUS), RuntimeError("daemon restarting"), (JOBS[:1], GPUS)])

    def fetch():
        r = next(results)
        if isinstance(r, Exception):
            raise r
        return r

    try:
        assert run_top(fetch, 0.01, out, sleep=lambda s: None, max_frames=3) == 0
        data = _read_pty(master, SHOW_CURSOR.encode()).decode()
    finally:
        out.close()
        os.close(master)
    assert data.startswith(HIDE_CURSOR) and data.endswith(SHOW_CURSOR)
    frames = data.split(HOME)[1:]
    assert len(frames) == 3 and all(CLEAR_BELOW in f for f in frames)
    assert "bert" in frames[0] and "spx top: RuntimeError: daemon restarting" in frames[1] and "bert" not in frames[2]


def _signalled_live_view(sig: signal.Signals) -> tuple[bytes, int]:
    """A live view on a real pty, sent `sig` once two frames are drawn: what it wrote, its exit status."""
    script = textwrap.dedent(
        """
        import sys
        from spx.daemon.cli.top import GpuRow, run_top
        gpus = [GpuRow(0, "NVIDIA H100 80GB HBM3", 50, 1 << 30, 80 << 30, 300.0, None)]
        sys.exit(run_top(lambda: ([], gpus), 0.05))
        """
    )
    master, slave = os.openpty()
    # SIGINT as at a terminal: a test run started in the background (`cmd &` without job control)
    # has it ignored, and an ignored SIGINT is inherited and never becomes KeyboardInterrupt.
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(slave)
    try:
        data = _read_pty(master, b"H100")
        data += _read_pty(master, HOME.encode(), timeout=5)
        assert data.count(HOME.encode()) >= 2, data  # at least two frames drawn in place
        proc.send_signal(sig)
        # Keep reading while it ends: frames queued in the pty meanwhile would otherwise fill it and
        # block the final write (and so the exit) on a slow machine.
        data += _read_pty(master, SHOW_CURSOR.encode(), timeout=60)
        code = proc.wait(timeout=30)
        data += _read_pty(master, b"\0never", timeout=0.5)  # anything after it (nothing is expected)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return data, code


def test_ctrl_c_ends_the_live_view_and_restores_the_cursor() -> None:
    data, code = _signalled_live_view(signal.SIGINT)
    assert code == 0
    assert data.rstrip(b"\r\n").endswith(SHOW_CURSOR.encode())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_ends_the_live_view_with_the_cursor_restored(sig: signal.Signals) -> None:
    """`kill PID` (or the terminal closing) is not Ctrl-C: without a handler Python dies at once and
    leaves the terminal's cursor hidden."""
    data, code = _signalled_live_view(sig)
    assert code == 128 + sig  # as a shell reports a process that signal ended
    assert data.rstrip(b"\r\n").endswith(SHOW_CURSOR.encode())


def test_spx_top_shows_the_gpus_the_daemon_uses_not_a_backend_of_its_own(tmp_path) -> None:
    """The daemon runs on the fake 8×H100 fixture; `spx` itself has no GPU backend configured
    (its default, auto, finds no NVML here) and still shows the daemon's eight GPUs."""
    from harness import Daemon
    from spx.daemon.service import control

    d = Daemon(tmp_path / "root", gpu_backend="fake").start()
    try:
        rows = control.request(tmp_path / "root" / "run" / "spx.sock", "gpus")["result"]
        frame = d.spx("top", "--once").stdout
    finally:
        d.stop()
    assert [r["index"] for r in rows] == list(range(8)) and all(r["name"] == "NVIDIA H100 80GB HBM3" for r in rows)
    assert "8 GPUs, 0 allocated" in frame.splitlines()[0] and "no GPUs" not in frame, frame
