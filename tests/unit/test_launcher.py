"""argv and environment of an attempt: pure, no processes."""

import base64
import json
from pathlib import Path

from spx.daemon.core.spec import parse_spec
from spx.daemon.run.launcher import LaunchContext, plan_launch


def ctx(gpus, resume=None):
    return LaunchContext(attempt=2, attempt_id="abc", gpus=gpus, port=29555, checkpoint_dir=Path("/ck/j"),
                         resume_from=resume, heartbeat_file=Path("/run/hb.json"), rank_log_dir=Path("/log/j/r"),
                         home="/home/alice", user="alice")


def test_torchrun_argv_and_env():
    spec = parse_spec("name: j\nscript: train.py\ngpus: 2\nargs: ['--ckpt', '{checkpoint_dir}']\n"
                      "resume_args: ['--resume', '{resume_from}']\nenv: {HF_HOME: /data/hf}\n")
    plan = plan_launch(spec, ctx([4, 5], Path("/ck/j/step-000000020")), default_python="/venv/bin/python")
    assert plan.argv[:3] == ["/venv/bin/python", "-m", "torch.distributed.run"]
    assert "--nproc-per-node=2" in plan.argv and "--max-restarts=0" in plan.argv and "--master-port=29555" in plan.argv
    assert plan.argv[-5:] == ["train.py", "--ckpt", "/ck/j", "--resume", "/ck/j/step-000000020"]
    env = plan.env
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5" and env["SPX_RESUME_FROM"] == "/ck/j/step-000000020"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # NVML's numbering, which the allocation uses
    assert env["SPX_ATTEMPT"] == "2" and env["HF_HOME"] == "/data/hf" and env["HOME"] == "/home/alice"
    assert env["PATH"].startswith("/venv/bin:")


def test_resume_args_only_when_resuming():
    spec = parse_spec("name: j\nscript: t.py\nresume_args: ['--init_from=resume']\n")
    assert "--init_from=resume" not in plan_launch(spec, ctx([])).argv
    assert plan_launch(spec, ctx([])).env["CUDA_VISIBLE_DEVICES"] == ""


def test_deepspeed_gets_the_allocated_gpus_not_0_to_n():
    spec = parse_spec("name: j\nlauncher: deepspeed\nscript: t.py\ndeepspeed_config: ds.json\ngpus: 2\n")
    argv = plan_launch(spec, ctx([4, 5])).argv
    world = next(a for a in argv if a.startswith("--world_info=")).split("=", 1)[1]
    assert json.loads(base64.urlsafe_b64decode(world)) == {"localhost": [4, 5]}
    assert argv[argv.index("t.py"):] == ["t.py", "--deepspeed", "--deepspeed_config", "ds.json"]


def test_python_module_launch():
    spec = parse_spec("name: j\nlauncher: python\nmodule: pkg.train\n")
    assert plan_launch(spec, ctx([]), default_python="/p").argv == ["/p", "-m", "pkg.train"]


def test_checkpoints_keep_reaches_the_workers_only_when_the_job_file_sets_it():
    """Set, the job file's `checkpoints.keep` wins over the script's own TrainerConfig(keep); unset,
    no variable, and the script's choice stands."""
    from spx.daemon.contract.worker_env import checkpoint_keep

    unset = plan_launch(parse_spec("name: j\nscript: t.py\n"), ctx([])).env
    assert "SPX_CHECKPOINT_KEEP" not in unset and checkpoint_keep(unset) is None
    kept = plan_launch(parse_spec("name: j\nscript: t.py\ncheckpoints: {keep: 7}\n"), ctx([])).env
    assert kept["SPX_CHECKPOINT_KEEP"] == "7" and checkpoint_keep(kept) == 7
    for garbage in ("0", "-1", "1001", "3.5", "99999999999999999999", "x", ""):
        assert checkpoint_keep({"SPX_CHECKPOINT_KEEP": garbage}) is None, garbage


def test_a_divergence_rollback_reaches_the_workers_as_skip_steps_and_the_jobs_divergence_args():
    from dataclasses import replace

    spec = parse_spec("name: j\nscript: t.py\nargs: ['--lr', '3e-4']\n")
    plain = plan_launch(spec, ctx([]))
    assert "SPX_SKIP_STEPS" not in plain.env and plain.argv[-3:] == ["t.py", "--lr", "3e-4"]
    rolled = plan_launch(spec, replace(ctx([], Path("/ck/j/step-000000030")), skip_steps=((31, 37),),
                                       extra_args=["--lr", "1e-4"]))
    assert rolled.env["SPX_SKIP_STEPS"] == "31-37"
    assert rolled.argv[-5:] == ["t.py", "--lr", "3e-4", "--lr", "1e-4"]  # the last --lr wins in argparse
