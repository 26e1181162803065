"""The trainer's parts in one process (world of one): sampler position, checkpoint schedule, a
failed background save, preemption, resume choice, gradient checkpointing."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness import EXAMPLES, wait_for
from spx.daemon.contract import checkpoint_layout as layout
from spx.daemon.contract.worker_env import EXIT_PREEMPTED, read_heartbeat
from spx.trainer import Preempted, Trainer, TrainerConfig
from spx.trainer.checkpoint import Checkpointer, CheckpointError, resolve_resume_path
from spx.trainer.data import ResumableDistributedSampler
from spx.trainer.grad_ckpt import enable_gradient_checkpointing
from spx.trainer.progress import CheckpointSchedule

sys.path.insert(0, str(EXAMPLES))
from tinylm import SIZES, MarkovCorpus, TinyLM  # noqa: E402


def test_sampler_skip_yields_exactly_the_rest_of_the_epoch():
    data = list(range(103))
    for rank in (0, 1):
        full = ResumableDistributedSampler(data, num_replicas=2, rank=rank, seed=3)
        full.set_epoch(4)
        order = list(full)
        resumed = ResumableDistributedSampler(data, num_replicas=2, rank=rank, seed=3)
        resumed.set_epoch(4, skip=17)
        assert list(resumed) == order[17:] and len(resumed) == len(order) - 17


def test_schedule_never_saves_step_zero_and_time_rule_uses_the_given_clock():
    s = CheckpointSchedule(every_steps=10, every_seconds=60, last_time=100.0)
    assert [n for n in range(0, 35) if s.due_by_steps(n)] == [10, 20, 30]
    assert not s.due_by_time(159.9) and s.due_by_time(160.0)
    s.saved(160.0)
    assert not s.due_by_time(200.0)


def test_a_failed_background_save_is_reported_and_never_published(tmp_path):
    ck = Checkpointer(tmp_path, rank=0, world_size=1, token="tok")

    def unserialisable():
        return {"model": {"w": torch.ones(3)}, "bad": lambda: None}  # torch.save cannot pickle a lambda

    ck.save(10, 0, {"r": 1}, unserialisable, blocking=False)
    error = ck.wait()
    assert error is not None and ck.failures == 1
    assert layout.latest_complete(tmp_path) is None
    (staging,) = tmp_path.iterdir()  # left for the next attempt to sweep; it carries the failure
    assert staging.name == "step-000000010.tmp-tok" and (staging / "rank-00000.failed").exists()
    ck.save(20, 0, {"r": 1}, lambda: {"model": {"w": torch.ones(3)}}, blocking=False)
    assert ck.wait() is None and layout.latest_complete(tmp_path).step == 20
    with pytest.raises(CheckpointError, match="step 30"):
        ck.save(30, 0, {"r": 1}, unserialisable, blocking=True)
    assert layout.latest_complete(tmp_path).step == 20
    Checkpointer(tmp_path, rank=0, world_size=1, token="next-attempt").sweep_stale()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000020"]


def _fit(ckpt: Path, steps: int, stop_at: int | None = None, hb: Path | None = None) -> tuple[Trainer, str | None]:
    trainer = Trainer(TrainerConfig(max_steps=steps, seed=11, checkpoint_dir=str(ckpt), checkpoint_every_steps=5,
                                    grad_accum_steps=2, max_grad_norm=1.0, handle_sigterm=False,
                                    heartbeat_file=str(hb) if hb else None, log_every_steps=0))
    lm = SIZES["tiny"]
    model = trainer.wrap(TinyLM(lm))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)
    loader = trainer.dataloader(MarkovCorpus(40, lm.seq_len, lm.vocab, seed=2), batch_size=4)

    def on_step(t, step, loss):
        if step == stop_at:
            t.stop_flag.request()  # what SIGTERM does

    try:
        trainer.fit(model, opt, loader, scheduler=sched, on_step=on_step)
        return trainer, trainer.state_sha256()
    finally:
        trainer.close()


def test_preemption_checkpoints_the_current_step_and_resume_is_exact_across_epochs(tmp_path):
    _, reference = _fit(tmp_path / "ref", steps=23)
    hb = tmp_path / "hb.json"
    with pytest.raises(Preempted) as stopped:
        _fit(tmp_path / "run", steps=23, stop_at=13, hb=hb)
    assert stopped.value.code == EXIT_PREEMPTED and stopped.value.step == 13
    assert layout.latest_complete(tmp_path / "run").step == 13
    beat = read_heartbeat(hb)
    assert beat.status == "preempted" and beat.step == 13 and beat.last_checkpoint_step == 13
    # Saves at steps 5 and 10 and SIGTERM's at 13: the loop's time in them, for the goodput ledger.
    assert beat.checkpoint_stall_seconds is not None and beat.checkpoint_stall_seconds > 0
    trainer, resumed = _fit(tmp_path / "run", steps=23)
    assert resumed == reference  # 10 batches per epoch, 2 per step: the resume point is mid-epoch 2


def test_bad_resume_from_falls_back_to_the_latest_complete_checkpoint(tmp_path, monkeypatch):
    ck = Checkpointer(tmp_path, rank=0, world_size=1, token="t")
    ck.save(5, 0, {"r": 0}, lambda: {"w": torch.zeros(1)}, blocking=True)
    monkeypatch.setenv("SPX_RESUME_FROM", str(tmp_path / "step-000000099"))
    assert resolve_resume_path(tmp_path) == tmp_path / "step-000000005"
    monkeypatch.setenv("SPX_RESUME_FROM", str(tmp_path / "step-000000005"))
    assert resolve_resume_path(tmp_path) == tmp_path / "step-000000005"


def test_gradient_checkpointing_of_a_plain_module_keeps_keys_and_gradients():
    torch.manual_seed(0)
    plain = torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(4)))
    patched = torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(4)))
    patched.load_state_dict(plain.state_dict())
    assert enable_gradient_checkpointing(patched) == 4
    assert list(patched.state_dict()) == list(plain.state_dict())
    x = torch.randn(3, 8)
    plain(x).sum().backward()
    patched(x).sum().backward()
    for a, b in zip(plain.parameters(), patched.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    with pytest.raises(ValueError, match="gradient_checkpointing_enable"):
        enable_gradient_checkpointing(torch.nn.Linear(2, 2))


def test_sigterm_to_a_single_process_run_exits_75_after_a_checkpoint(tmp_path):
    hb = tmp_path / "hb.json"
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "train_ddp.py"), "--steps", "500", "--checkpoint-every", "100",
         "--sleep-per-step", "0.05", "--checkpoint-dir", str(tmp_path / "ck")],
        env={"SPX_HEARTBEAT_FILE": str(hb), "PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )
    wait_for(lambda: (read_heartbeat(hb) or None) and read_heartbeat(hb).step >= 3, 60, "training to start")
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_PREEMPTED, out
    beat = read_heartbeat(hb)
    assert beat.status == "preempted"
    assert layout.latest_complete(tmp_path / "ck").step == beat.step


def test_bf16_autocast_runs_on_cpu_when_forced_and_auto_follows_the_hardware():
    from spx.trainer.precision import cpu_has_native_bf16, resolve_bf16

    assert resolve_bf16("auto", torch.device("cpu")) == cpu_has_native_bf16()
    trainer = Trainer(TrainerConfig(max_steps=3, bf16=True, resume=False, save_final=False, handle_sigterm=False,
                                    log_every_steps=0, checkpoint_dir="/nonexistent-never-written"))
    try:
        lm = SIZES["tiny"]
        model = trainer.wrap(TinyLM(lm))
        seen = []
        model.blocks[0].qkv.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        result = trainer.fit(model, opt, trainer.dataloader(MarkovCorpus(16, lm.seq_len, lm.vocab), batch_size=4))
        assert result.step == 3 and seen and set(seen) == {torch.bfloat16}
        assert all(p.dtype == torch.float32 for p in model.parameters()), "autocast keeps fp32 master weights"
    finally:
        trainer.close()


def test_the_job_files_keep_wins_over_the_scripts(tmp_path, monkeypatch):
    """Checkpoints at steps 5, 10, 15, 20 and the final 23: the script's keep (3) leaves three; the
    job file's `checkpoints.keep: 1` (SPX_CHECKPOINT_KEEP, set by the daemon) leaves the newest only."""
    _fit(tmp_path / "script", steps=23)
    assert sorted(p.name for p in (tmp_path / "script").iterdir() if p.name.startswith("step-")) == [
        "step-000000015", "step-000000020", "step-000000023"]
    monkeypatch.setenv("SPX_CHECKPOINT_KEEP", "1")
    _fit(tmp_path / "job", steps=23)
    assert [p.name for p in (tmp_path / "job").iterdir() if p.name.startswith("step-")] == ["step-000000023"]


def test_rank_timing_reports_each_ranks_best_window_and_nothing_when_off():
    from spx.trainer.rank_timing import RankTimer

    timer = RankTimer(every=2, device=torch.device("cpu"), distributed=False, windows=3)
    work = [0.004, 0.004, 0.002, 0.002, 0.006, 0.006, 0.008, 0.008]  # CPU seconds of each step's forward
    latest = []
    for seconds in work:
        with timer.forward():
            began = time.process_time()
            while time.process_time() - began < seconds:
                pass
        timer.step_done()
        latest.append(timer.latest)
    assert latest[0] == [] and latest[1]  # the first gather: after 2 steps (empty before: timed, none yet)
    assert latest[1][0] >= 0.004
    assert 0.002 <= latest[3][0] < 0.004  # the best window of the last 3: the 2 ms one
    assert 0.002 <= latest[7][0] < 0.004  # still in the last 3 windows (4, 2, 6, 8 ms: 2, 6, 8)
    off = RankTimer(every=0, device=torch.device("cpu"), distributed=False)
    with off.forward():
        pass
    off.step_done()
    assert off.latest is None


def test_the_boundary_file_is_written_before_the_backward_and_again_if_the_update_drew(tmp_path):
    from spx.trainer import rng
    from spx.trainer.jit import JitCheckpoint

    jit = JitCheckpoint(enabled=True, boundary_parent=tmp_path, ckpt_dir=tmp_path / "ck", rank=0, world_size=2,
                        token="t", fmt="torch", checksums=False)
    b = jit.boundaries
    state = lambda: {"rng": rng.capture(), "progress": {"step": 7}}  # noqa: E731
    jit.record(7, state)  # step 7's forward is done; its backward comes next
    assert b.path(0, 7).exists() and b.step is None, "the file of step 7 exists before its all-reduce"
    jit.before_update()
    before = torch.load(b.path(0, 7), weights_only=True)["rng"]
    jit.after_update(7, state)  # an update that drew nothing: the file stays the one written before the backward
    assert b.step == 7 and rng.same(torch.load(b.path(0, 7), weights_only=True)["rng"], before)

    jit.record(8, state)
    assert b.step == 7, "until its update, the model in memory is still step 7's (a survivor saves that)"
    jit.before_update()
    torch.rand(1)  # an optimizer with stochastic rounding draws inside the update
    jit.after_update(8, state)
    kept = torch.load(b.path(0, 8), weights_only=True)["rng"]
    assert b.step == 8 and rng.same(kept, rng.capture()) and not rng.same(kept, before)
    jit.record(9, state)
    assert not b.path(0, 7).exists() and b.path(0, 8).exists(), "two steps' files are kept"
    assert b.last_steps([0, 1]) == {0: 9, 1: None}
    jit.before_update()
    jit.after_update(10, state)  # a micro-batch that never called before_backward: written after the update
    assert b.step == 10 and b.path(0, 10).exists()
