"""The first error of an attempt, read from torchrun's failure summary and the workers' tracebacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from spx.daemon.core.causes import cause_class
from spx.daemon.run.rootcause import error_class, find_root_cause, root_cause_of

# torchrun 2.13's summary after `kill -9` of rank 1: it SIGTERMs rank 0 (listed under Failures)
# and names rank 1 as the root cause.
KILLED_RANK_1 = """\
E1203 08:07:04.995000 9848 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 9854) of binary: python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
train_ddp.py FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-03_08:07:04
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 9853)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 9853
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_08:07:04
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 9854)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 9854
======================================================
"""

CRASHED_RANK_0 = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "train.py", line 3, in <module>
[rank0]: ValueError: learning rate must be positive
[rank1]: RuntimeError: Connection closed by peer
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4242)
"""


def test_root_cause_is_the_rank_torchrun_names_not_the_ones_it_stopped(tmp_path):
    log = tmp_path / "attempt-1.log"
    log.write_text(KILLED_RANK_1)
    assert find_root_cause(log) == "rank 1 (pid 9854) killed by SIGKILL (signal)"


def test_a_crashed_rank_carries_the_first_exception(tmp_path):
    log = tmp_path / "attempt-1.log"
    log.write_text(CRASHED_RANK_0)
    assert find_root_cause(log) == ("rank 0 (pid 4242) exited with code 1: ValueError: learning rate must be positive (user-code); "
                                   "rank 1: RuntimeError: Connection closed by peer (consequence)")


def test_without_a_summary_the_exception_is_the_cause_and_no_error_is_none(tmp_path):
    log = tmp_path / "attempt-1.log"
    log.write_text("step 1\nTraceback (most recent call last):\nKeyError: 'x'\n")
    assert find_root_cause(log) == "KeyError: 'x' (user-code)"
    log.write_text("step 1\nstep 2\n")
    assert find_root_cause(log) is None
    assert find_root_cause(tmp_path / "missing.log") is None


def _log_in_job_dir(tmp_path):
    """log/NAME/attempt-1.log, as the daemon lays it out (the read walks from log/)."""
    job_dir = tmp_path / "log" / "job"
    job_dir.mkdir(parents=True)
    return job_dir / "attempt-1.log"


def test_a_symlinked_attempt_log_is_not_followed(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text(CRASHED_RANK_0)
    log = _log_in_job_dir(tmp_path)
    log.symlink_to(secret)
    assert find_root_cause(log) is None


def test_a_fifo_at_the_attempt_log_answers_at_once(tmp_path):
    import os
    import time

    log = _log_in_job_dir(tmp_path)
    os.mkfifo(log)
    t0 = time.monotonic()
    assert find_root_cause(log) is None
    assert time.monotonic() - t0 < 1.0


def test_only_the_tail_of_a_huge_log_is_read(tmp_path):
    from spx.daemon.run.rootcause import TAIL_BYTES

    log = _log_in_job_dir(tmp_path)
    log.write_bytes(b"ValueError: early noise\n" + b"x" * (2 * TAIL_BYTES) + b"\n" + CRASHED_RANK_0.encode())
    found = find_root_cause(log)
    assert found and "early noise" not in found and found == find_root_cause_of_text(CRASHED_RANK_0)


def find_root_cause_of_text(text: str) -> str | None:
    from spx.daemon.run.rootcause import root_cause_of

    return root_cause_of(text.encode())


# torch >= 2.4 under `torchrun --tee 3`: the agent's `[ROLE+LOCAL_RANK]:` prefix, then torch's own
# `[rankN]:`; the exception's class is the script's own (no Error/Exception suffix).
DOUBLE_PREFIX = """\
[default0]:[rank0]: Traceback (most recent call last):
[default0]:[rank0]:   File "/x/train_ddp.py", line 80, in <module>
[default0]:[rank0]:     raise InjectedCrash(f"injected crash at step {step}")
[default0]:[rank0]: example_args.InjectedCrash: injected crash at step 25
[default1]:[rank1]: RuntimeError: Connection closed by peer
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4242)
"""


def test_both_prefixes_are_stripped_and_any_raised_class_is_the_exception():
    assert find_root_cause_of_text(DOUBLE_PREFIX) == (
        "rank 0 (pid 4242) exited with code 1: example_args.InjectedCrash: injected crash at step 25 (user-code); "
        "rank 1: RuntimeError: Connection closed by peer (consequence)")


def test_tracebacks_of_two_ranks_interleaved_are_read_per_rank():
    text = ("[default1]:[rank1]: Traceback (most recent call last):\n"
            "[default0]:[rank0]: Traceback (most recent call last):\n"
            "[default1]:[rank1]:   File \"t.py\", line 3, in <module>\n"
            "[default0]:[rank0]:   File \"t.py\", line 3, in <module>\n"
            "[default1]:[rank1]: Boom: first\n"
            "[default0]:[rank0]: Boom: second\n")
    assert find_root_cause_of_text(text) == "rank 1: Boom: first (user-code); rank 0: Boom: second (consequence)"


def test_the_agents_own_traceback_and_log_lines_are_not_the_cause():
    text = ("W1203 15:47:42.336000 11064 torch/distributed/elastic/multiprocessing/api.py:1028] Sending SIGTERM\n"
            "Traceback (most recent call last):\n  File \"run.py\", line 1032, in <module>\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
    assert find_root_cause_of_text(text) is None


# Captured from this venv's torchrun (2.13, gloo, --tee=3) running tests/fixtures/scripts/rank1_raises.py:
# rank 1 raises, rank 0 dies in its next all_reduce, torchrun SIGTERMs rank 0 and names rank 1.
GLOO_LOG = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "rank1_raises_gloo.log"


def test_rank_1_raising_is_the_cause_and_rank_0s_broken_connection_its_consequence():
    found = root_cause_of(GLOO_LOG.read_bytes())
    assert found is not None and "\n" not in found
    cause, consequence = found.split("; ")
    assert cause == "rank 1 (pid 9051) exited with code 1: ValueError: bad batch at step 3 (user-code)"
    assert consequence.startswith("rank 0: RuntimeError: Connection closed by peer [127.0.0.1]:20658.")
    assert consequence.endswith("(consequence)") and "pair.cc" not in consequence, "gloo's source location is dropped"
    assert cause_class(found) == "user-code"


def test_torchruns_root_rank_with_a_connection_error_yields_to_the_rank_that_raised():
    """torchrun names the first exit it *observed*; when that is rank 0's connection error and rank 1
    raised a ValueError, rank 1 is the cause."""
    text = ("[default1]:[rank1]: Traceback (most recent call last):\n"
            "[default1]:[rank1]: ValueError: bad batch\n"
            "[default0]:[rank0]: Traceback (most recent call last):\n"
            "[default0]:[rank0]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
            "remote process exited or there was a network error\n"
            "Failures:\n  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 12)\n"
            "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 11)\n")
    found = root_cause_of(text.encode())
    cause, consequence = found.split("; ")
    assert cause == "rank 1 (pid 12) exited with code 1: ValueError: bad batch (user-code)"
    # A consequence is cut to MAX_CONSEQUENCE_CHARS: the line stays one a terminal shows.
    assert consequence == ("rank 0: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
                           "remote process exited or there was a… (consequence)")


@pytest.mark.parametrize(("line", "cls"), [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom"),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "cuda"),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "gpu-fault"),
    ("torch.distributed.DistBackendError: [Rank 0] Watchdog caught collective operation timeout", "communication"),
    ("RuntimeError: Connection reset by peer", "communication"),
    ("KeyError: 'label'", "user-code"),
    ("TimeoutError: dataset download timed out", "user-code"),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for "
     "recv operation to complete", "communication"),
])
def test_each_error_line_has_its_class(line, cls):
    assert error_class(line) == cls
    found = root_cause_of(f"Traceback (most recent call last):\n  File \"t.py\", line 1\n{line}\n".encode())
    assert cause_class(found) == cls


def test_a_line_about_ecc_that_is_no_fault_is_not_one():
    found = root_cause_of(b"nvidia-smi: ECC errors: 0, Xid events: none\nTraceback (most recent call last):\nKeyError: 1\n")
    assert found == "KeyError: 1 (user-code)"


def test_a_gpu_fault_in_the_log_explains_the_cuda_error_after_it():
    text = ("NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.\n"
            "[rank0]: RuntimeError: CUDA error: unspecified launch failure\n")
    found = root_cause_of(text.encode())
    assert cause_class(found) == "gpu-fault" and found.startswith("rank 0: NVRM: Xid"), found


def test_a_worker_the_daemon_saw_die_stands_in_for_the_summary_torchrun_never_printed():
    """The daemon killed the attempt at a worker's death (a script without a heartbeat): torchrun died
    with it before its failure summary, so the dead worker's rank, pid and end come from the daemon."""
    text = ("[default1]:[rank1]: Traceback (most recent call last):\n"
            "[default1]:[rank1]: ValueError: bad batch\n")
    assert root_cause_of(text.encode()) == "rank 1: ValueError: bad batch (user-code)"
    assert root_cause_of(text.encode(), (1, 1, 4242)) == "rank 1 (pid 4242) exited with code 1: ValueError: bad batch (user-code)"
    killed = root_cause_of(b"", (1, -9, 4242))
    assert killed == "rank 1 (pid 4242) killed by SIGKILL (signal)", killed
    summary = root_cause_of(KILLED_RANK_1.encode(), (1, -9, 1))
    assert summary is not None and summary.startswith("rank 1 (pid 9854)"), "torchrun's own summary wins where it exists"
