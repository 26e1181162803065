"""The pipes between the daemon, an attempt monitor and a standby agent, read and written with a
deadline (run/launcher.py) — the other end may be a user's process that never answers — and the
monitor's test that an agent took its plan (run/attempt_monitor.py). Pipes only, no processes."""

from __future__ import annotations

import os
import time

import pytest

from spx.daemon.run import attempt_monitor, launcher


@pytest.fixture
def pipe():
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


def test_a_status_read_to_its_end_before_the_deadline(pipe):
    r, w = pipe
    os.write(w, b'{"step": "exec"}')
    os.close(w)
    assert launcher.read_to_eof(r, time.monotonic() + 5) == b'{"step": "exec"}'


def test_a_status_that_never_ends_is_a_timeout_not_a_wait(pipe):
    r, w = pipe
    os.write(w, b"partial")
    with pytest.raises(TimeoutError):
        launcher.read_to_eof(r, time.monotonic() + 0.05)


def test_a_plan_larger_than_a_pipe_holds_is_a_timeout_when_nobody_reads_it(pipe):
    r, w = pipe
    with pytest.raises(TimeoutError):
        launcher.write_all(w, b"x" * (4 << 20), time.monotonic() + 0.05)


def test_the_monitor_sees_whether_the_agent_read_its_plan_before_it_closed_its_end(pipe):
    r, w = pipe
    os.write(w, b'{"argv": []}\n')
    os.close(r)  # the agent gone with its plan unread
    assert attempt_monitor._taken(w) is False
    r2, w2 = os.pipe()
    try:
        os.write(w2, b'{"argv": []}\n')
        assert os.read(r2, 100) == b'{"argv": []}\n'
        os.close(r2)  # read whole, then stdin closed: taken
        assert attempt_monitor._taken(w2) is True
    finally:
        os.close(w2)
