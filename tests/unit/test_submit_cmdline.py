"""`spx submit -- COMMAND`: command lines as users type them → the job spec, every refusal's message,
the interpreter found from the user's PATH, and the round trip through the launcher's argv."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

from spx.daemon.cli import main as cli
from spx.daemon.cli.launch_cmdline import CommandLineError, parse_command
from spx.daemon.cli.submit_cmdline import Host, Options, job_from_command, split_command
from spx.daemon.core.spec import parse_spec
from spx.daemon.run.launcher import LaunchContext, plan_launch

VENV_BIN = str(Path(sys.executable).parent)  # where this checkout's torchrun and deepspeed live


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    """A user's project: the scripts and config the command lines name."""
    for f in ("train.py", "My Train.py", "ds_config.json", "sub/ds.json"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    return tmp_path


def host(cwd: Path, host_gpus: int = 8, path: str = VENV_BIN) -> Host:
    return Host(cwd=cwd, path=path, own_python=sys.executable, gpus=host_gpus, gpus_seen_by="the daemon")


def job(proj: Path, line: str | list[str], host_gpus: int = 8, path: str = VENV_BIN, **options: object) -> dict:
    """The job file `spx submit [OPTIONS] -- line` makes, read back as plain data (header checked)."""
    argv = line.split() if isinstance(line, str) else line
    spec, text, notes = job_from_command(argv, Options(**options), host(proj, host_gpus, path))  # type: ignore[arg-type]
    assert text.startswith(f"# spx submit -- {argv[0]}"), text
    assert all(f"#   {n}" in text for n in notes), text
    assert parse_spec(text) == spec
    data = yaml.safe_load(text)
    assert data.pop("workdir") == str(proj)
    return data


SEED_TORCHRUN = "torchrun --nproc_per_node=8 --nnodes=1 train.py --batch_size 32 --gradient_checkpointing"
SEED_ARGS = ["--batch_size", "32", "--gradient_checkpointing"]

# (command line, spx options, GPUs the daemon has) → the job's fields (workdir: the directory it was run in)
CASES = [
    (SEED_TORCHRUN, {}, 8, {"name": "train", "launcher": "torchrun", "script": "train.py", "args": SEED_ARGS, "gpus": 8}),
    (SEED_TORCHRUN, {}, 0,
     {"name": "train", "launcher": "torchrun", "script": "train.py", "args": SEED_ARGS, "gpus": 0, "procs": 8}),
    (SEED_TORCHRUN, {"gpus": 0}, 8,
     {"name": "train", "launcher": "torchrun", "script": "train.py", "args": SEED_ARGS, "gpus": 0, "procs": 8}),
    (SEED_TORCHRUN, {"gpus": 4}, 8,
     {"name": "train", "launcher": "torchrun", "script": "train.py", "args": SEED_ARGS, "gpus": 4, "procs": 8}),
    ("torchrun --nproc-per-node 2 --standalone --node-rank=0 train.py", {"gpus": [2, 3]}, 8,
     {"name": "train", "launcher": "torchrun", "script": "train.py", "gpus": [2, 3]}),
    ("torchrun train.py", {}, 8, {"name": "train", "launcher": "torchrun", "script": "train.py", "gpus": 1}),
    ("torchrun --nnodes 1:1 -m pkg.train --lr 1e-3", {}, 0,
     {"name": "pkg.train", "launcher": "torchrun", "module": "pkg.train", "args": ["--lr", "1e-3"], "gpus": 0}),
    ("torchrun --nproc_per_node=2 -- train.py --nproc_per_node=5", {}, 0,
     {"name": "train", "launcher": "torchrun", "script": "train.py", "args": ["--nproc_per_node=5"], "gpus": 0,
      "procs": 2}),
    # The seed's DeepSpeed line (Hugging Face's `--deepspeed FILE`): the arguments stay as they are.
    ("deepspeed --num_gpus=8 train.py --deepspeed ds_config.json --model_name_or_path meta-llama/Meta-Llama-3.1-70B",
     {}, 8, {"name": "train", "launcher": "deepspeed", "script": "train.py", "deepspeed_config": "ds_config.json",
             "args": ["--deepspeed", "ds_config.json", "--model_name_or_path", "meta-llama/Meta-Llama-3.1-70B"],
             "gpus": 8}),
    ("deepspeed --include localhost:0,1 train.py --deepspeed --deepspeed_config sub/ds.json", {}, 8,
     {"name": "train", "launcher": "deepspeed", "script": "train.py", "deepspeed_config": "sub/ds.json",
      "args": ["--deepspeed", "--deepspeed_config", "sub/ds.json"], "gpus": [0, 1]}),
    ("deepspeed train.py --deepspeed_config=ds_config.json", {}, 4,
     {"name": "train", "launcher": "deepspeed", "script": "train.py", "deepspeed_config": "ds_config.json",
      "args": ["--deepspeed_config=ds_config.json"], "gpus": 4}),
    ("deepspeed --num_accelerators 2 --num_nodes=1 train.py --deepspeed ds_config.json", {}, 0,
     {"name": "train", "launcher": "deepspeed", "script": "train.py", "deepspeed_config": "ds_config.json",
      "args": ["--deepspeed", "ds_config.json"], "gpus": 0, "procs": 2}),
    ("python train.py --epochs 3", {}, 8,
     {"name": "train", "launcher": "python", "script": "train.py", "args": ["--epochs", "3"], "gpus": 1}),
    ("python3 -u -m pkg.eval", {}, 0, {"name": "pkg.eval", "launcher": "python", "module": "pkg.eval", "gpus": 0}),
    ("python -m torch.distributed.run --nproc_per_node=2 train.py", {}, 8,
     {"name": "train", "launcher": "torchrun", "script": "train.py", "gpus": 2}),
    ("python -m deepspeed.launcher.runner --num_gpus 2 train.py --deepspeed ds_config.json", {}, 8,
     {"name": "train", "launcher": "deepspeed", "script": "train.py", "deepspeed_config": "ds_config.json",
      "args": ["--deepspeed", "ds_config.json"], "gpus": 2}),
    (["torchrun", "--nproc_per_node=2", "My Train.py", "--note", "yes", "--x", "0x1F", "--when", "2024-01-01"],
     {"name": "run-7", "fresh": True}, 8,
     {"name": "run-7", "launcher": "torchrun", "script": "My Train.py", "gpus": 2, "checkpoints": {"resume": "never"},
      "args": ["--note", "yes", "--x", "0x1F", "--when", "2024-01-01"]}),
    (["torchrun", "My Train.py"], {"checkpoints": "ckpt/../runs"}, 0,
     {"name": "my-train", "launcher": "torchrun", "script": "My Train.py", "gpus": 0, "checkpoints": {"dir": "{proj}/runs"}}),
]


@pytest.mark.parametrize(("line", "options", "gpus", "want"), CASES)
def test_command_line_becomes_the_job(proj, line, options, gpus, want):
    if "checkpoints" in want and "dir" in want["checkpoints"]:
        want = {**want, "checkpoints": {"dir": want["checkpoints"]["dir"].format(proj=proj)}}
    assert job(proj, line, gpus, **options) == want


# Every refusal names the flag and what to use instead.
ERRORS = [
    ("torchrun --master_port=29500 train.py", "torchrun --master_port: the daemon sets the rendezvous itself"),
    ("torchrun --master-addr 10.0.0.1 train.py", "torchrun --master-addr: the daemon sets the rendezvous"),
    ("torchrun --rdzv-endpoint=localhost:0 train.py", "torchrun --rdzv-endpoint: the daemon sets the rendezvous"),
    ("torchrun --rdzv_backend c10d train.py", "torchrun --rdzv_backend: the daemon sets the rendezvous"),
    ("torchrun --max-restarts=3 train.py", "torchrun --max-restarts: the daemon relaunches failed attempts itself"),
    ("torchrun --max_restarts 3 train.py", "set restart.max_restarts in a job file"),
    ("torchrun --nnodes=2 train.py", "torchrun nodes=2: multi-node jobs are not translated from a command line: write a job file with nodes.count"),
    ("torchrun --nnodes=1:4 train.py", "nodes.count"),
    ("torchrun --node_rank=1 train.py", "torchrun node rank 1: multi-node"),
    ("torchrun --monitor-interval 5 train.py", "restart.hang_timeout_seconds"),
    ("torchrun --redirects 3 train.py", "torchrun --redirects: the daemon keeps every rank's output"),
    ("torchrun -t3 train.py", "torchrun -t: the daemon keeps every rank's output, rank-prefixed, in the attempt's log (`spx logs NAME`)"),
    ("torchrun --log-dir=/tmp/x train.py", "`spx logs NAME`"),
    ("torchrun --no-python train.py", "the job spec's `python` picks which"),
    ("torchrun --nproc_per_node=auto train.py", "give the number of workers"),
    ("torchrun --nproc_per_node=0 train.py", "as a number from 1 to 512"),
    ("torchrun --nproc_per_node", "torchrun --nproc_per_node: needs a value"),
    ("torchrun --standalone=1 train.py", "torchrun --standalone: takes no value"),
    ("torchrun --nproc 8 train.py", "torchrun --nproc: unknown flag (`spx submit --` translates --nproc_per_node"),
    ("torchrun --nproc_per_node=2", "torchrun: no script to run"),
    ("deepspeed --master_port 29501 train.py --deepspeed ds_config.json", "deepspeed --master_port: the daemon sets the rendezvous"),
    ("deepspeed --hostfile hosts train.py --deepspeed ds_config.json", "deepspeed --hostfile: multi-node"),
    ("deepspeed -H hosts train.py --deepspeed ds_config.json", "deepspeed -H: multi-node"),
    ("deepspeed --launcher pdsh train.py --deepspeed ds_config.json", "deepspeed --launcher: multi-node"),
    ("deepspeed --num_nodes=2 train.py --deepspeed ds_config.json", "deepspeed nodes=2: multi-node"),
    ("deepspeed --include worker-1:0,1 train.py --deepspeed ds_config.json", "only `localhost:GPU,GPU…` (one host)"),
    ("deepspeed --exclude localhost:3 train.py --deepspeed ds_config.json", "`spx submit --gpus 0,1`"),
    ("deepspeed --num_gpus 2 --include localhost:0 train.py --deepspeed ds_config.json", "not both"),
    ("deepspeed --no_local_rank train.py --deepspeed ds_config.json", "passes --local_rank to each worker"),
    ("deepspeed --module pkg --deepspeed ds_config.json", "runs a script, not a module"),
    ("deepspeed --num_gpus=2 train.py --lr 1", "the script's arguments name no DeepSpeed config"),
    ("deepspeed --bogus train.py --deepspeed ds_config.json", "deepspeed --bogus: unknown flag"),
    ("python -c print(1)", "python -c: interpreter options are not translated (only -u)"),
    ("python -m", "python -m: needs a module"),
    ("python -m torch.distributed.launch train.py", "write it as torchrun"),
    ("accelerate launch train.py", "`accelerate` is not torchrun, deepspeed or python"),
]


@pytest.mark.parametrize(("line", "message"), ERRORS)
def test_refused_command_lines_say_what_to_use_instead(proj, line, message):
    with pytest.raises(CommandLineError) as e:
        job(proj, line)
    assert message in str(e.value)


def test_unsupported_launcher_flags_are_never_dropped_silently():
    """Every torchrun/deepspeed flag a user can pass is either translated or refused: parsing the
    launcher's own argument parser's flags one by one finds none that is silently accepted."""
    torch_run = pytest.importorskip("torch.distributed.run")
    translated = {"--nproc-per-node", "--nproc_per_node", "--nnodes", "--standalone", "-m", "--module",
                  "--node-rank", "--node_rank"}
    for action in torch_run.get_args_parser()._actions:
        for flag in action.option_strings:
            value = [] if action.nargs == 0 else ["1"]
            if flag in translated:
                continue
            with pytest.raises(CommandLineError, match=f"torchrun {flag}: "):
                parse_command(["torchrun", flag, *value, "train.py"])


@pytest.mark.parametrize(("line", "options", "gpus", "message"), [
    ("deepspeed --num_gpus=2 train.py --deepspeed ds_config.json", {"gpus": 4}, 8, "disagree: deepspeed runs one worker per GPU"),
    ("deepspeed --include localhost:0,1 train.py --deepspeed ds_config.json", {"gpus": 2}, 8, "disagree"),
    ("deepspeed train.py --deepspeed ds_config.json", {}, 0, "give --num_gpus N for N workers"),
    ("torchrun --nproc_per_node=2 missing.py", {}, 8, "script missing.py: no such file in"),
    ("deepspeed --num_gpus=2 train.py --deepspeed nope.json", {}, 8, "DeepSpeed config nope.json: no such file"),
    ("torchrun train.py", {"name": "Train"}, 8, "the job this makes is not valid: name: must match"),
    ("nosuchlauncher/torchrun train.py", {}, 8, "nosuchlauncher/torchrun: not found; activate the environment"),
])
def test_what_the_host_and_options_refuse(proj, line, options, gpus, message):
    with pytest.raises(CommandLineError) as e:
        job(proj, line, gpus, **options)
    assert message in str(e.value)


def test_launcher_not_on_path(proj, tmp_path):
    with pytest.raises(CommandLineError, match="torchrun: not found on PATH; activate the environment"):
        job(proj, "torchrun train.py", path=str(tmp_path / "empty"))


def fake_env(root: Path) -> Path:
    """Another Python environment: bin/python (this interpreter under another directory) and its
    console scripts, as pip writes them."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    return bin_dir


@pytest.mark.parametrize("shebang", [
    "#!{bin}/python\n", "#!/usr/bin/env python\n", "#!/usr/bin/env -S python -E\n",
    "#!/bin/sh\n'''exec' \"{bin}/python\" \"$0\" \"$@\"\n' '''\n", "#!/bin/sh\n'''exec' {bin}/python \"$0\" \"$@\"\n' '''\n",
])
def test_the_job_runs_in_the_environment_of_the_launcher_the_user_named(proj, tmp_path, shebang):
    bin_dir = fake_env(tmp_path / "venv")
    (bin_dir / "torchrun").write_text(shebang.format(bin=bin_dir) + "from torch.distributed.run import main\n")
    (bin_dir / "torchrun").chmod(0o755)
    data = job(proj, "torchrun train.py", path=f"{bin_dir}:{VENV_BIN}")
    assert data["python"] == f"{bin_dir}/python"


def test_spx_own_environment_needs_no_python_line_and_a_named_interpreter_is_kept(proj, tmp_path):
    assert "python" not in job(proj, "torchrun train.py")
    assert "python" not in job(proj, [f"{VENV_BIN}/deepspeed", "train.py", "--deepspeed", "ds_config.json"])
    bin_dir = fake_env(tmp_path / "venv")
    assert job(proj, f"{bin_dir}/python train.py")["python"] == f"{bin_dir}/python"
    rel = os.path.relpath(bin_dir / "python", proj)
    assert job(proj, f"{rel} -m torch.distributed.run train.py")["python"] == f"{bin_dir}/python"


def test_a_launcher_whose_interpreter_cannot_be_told_is_refused_with_the_way_round(proj, tmp_path):
    bin_dir = fake_env(tmp_path / "venv")
    (bin_dir / "torchrun").write_bytes(b"\x7fELF\x02\x01\x01")
    with pytest.raises(CommandLineError, match=r"give the interpreter instead: `spx submit -- /path/to/python -m "
                                               r"torch.distributed.run"):
        job(proj, f"{bin_dir}/torchrun train.py")


def launched(data: dict, proj: Path) -> list[str]:
    spec = parse_spec(yaml.safe_dump(data | {"workdir": str(proj)}))
    ctx = LaunchContext(attempt=1, attempt_id="a", gpus=[0, 1], port=29500, checkpoint_dir=proj / "ck",
                        resume_from=None, heartbeat_file=proj / "hb", rank_log_dir=proj / "logs", home="/root",
                        user="root")
    plan = plan_launch(spec, ctx)
    assert plan.cwd == str(proj)
    return plan.argv


@pytest.mark.parametrize("line", [
    SEED_TORCHRUN,
    "torchrun --nproc_per_node=2 -m pkg.train --x 1",
    "deepspeed --num_gpus=2 train.py --deepspeed ds_config.json --model_name_or_path m",
    "deepspeed --num_gpus=2 train.py --seed 3 --deepspeed --deepspeed_config ds_config.json",
    "python train.py --epochs 3",
])
def test_the_daemon_launches_the_script_with_exactly_the_arguments_typed(proj, line):
    """The round trip: the daemon's argv ends with the user's script (or module) and its arguments
    as typed, so the script parses what it parsed by hand (DeepSpeed's config flags not added twice)."""
    argv = line.split()
    target = argv.index("-m") if "-m" in argv else next(i for i, a in enumerate(argv) if a.endswith(".py"))
    tail = launched(job(proj, line), proj)
    user = argv[target:]
    if user[0] == "-m":  # torchrun -m X → the daemon's `--module X`
        assert tail[tail.index("--module"):] == ["--module", *user[1:]]
    else:
        assert tail[tail.index(user[0]):] == user


def test_a_job_file_without_config_arguments_still_gets_them_from_the_launcher(proj):
    argv = launched({"name": "j", "launcher": "deepspeed", "script": "train.py", "deepspeed_config": "ds.json",
                     "args": ["--seed", "1"], "gpus": 2}, proj)
    assert argv[argv.index("train.py"):] == ["train.py", "--deepspeed", "--deepspeed_config", "ds.json", "--seed", "1"]


def test_split_command_takes_everything_after_the_first_double_dash_of_submit():
    assert split_command(["--root", "r", "submit", "--name", "x", "--", "torchrun", "--", "t.py", "--"]) == (
        ["--root", "r", "submit", "--name", "x"], ["torchrun", "--", "t.py", "--"])
    assert split_command(["submit", "job.yaml"]) == (["submit", "job.yaml"], None)
    assert split_command(["logs", "--", "submit"]) == (["logs", "--", "submit"], None)


def test_dry_run_prints_the_job_file_and_drops_nothing(proj, tmp_path, monkeypatch, capsys):
    root = tmp_path / "root"
    monkeypatch.chdir(proj)
    monkeypatch.setenv("PATH", f"{VENV_BIN}:/usr/bin:/bin")
    code = cli.main(["--root", str(root), "submit", "--dry-run", "--gpus", "0", "--", "torchrun",
                     "--nproc_per_node=2", "train.py", "--batch_size", "8"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines()[0] == "# spx submit -- torchrun --nproc_per_node=2 train.py --batch_size 8"
    assert yaml.safe_load(out) == {"name": "train", "launcher": "torchrun", "workdir": str(proj), "script": "train.py",
                                   "args": ["--batch_size", "8"], "gpus": 0, "procs": 2}
    assert not list((root / "spool").glob("*")) if (root / "spool").exists() else True


@pytest.mark.parametrize(("argv", "message"), [
    (["submit"], "give a job file (`spx submit job.yaml`) or the command line"),
    (["submit", "job.yaml", "--name", "x"], "--name, --gpus, --checkpoints and --dry-run go with a command line"),
    (["submit", "job.yaml", "--", "torchrun", "train.py"], "give a job file (job.yaml) or `-- COMMAND`, not both"),
    (["submit", "--", "torchrun", "--max_restarts=3", "train.py"], "restart.max_restarts"),
])
def test_cli_usage_errors_exit_2_with_the_reason(proj, tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(proj)
    monkeypatch.setenv("PATH", f"{VENV_BIN}:/usr/bin:/bin")
    assert cli.main(["--root", str(tmp_path / "root"), *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_readme_command_lines_are_the_ones_spx_submit_takes(proj):
    """The README's "From the command line" lines, as written, make the job they describe (run from
    a directory with their train.py and ds_config.json)."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("\n### From the command line\n", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [line.split("  #", 1)[0].split() for line in block.splitlines() if line.strip()]
    assert [line[:2] for line in lines] == [["spx", "submit"]] * 3
    jobs = []
    for line in lines:
        options = {"name": line[line.index("--name") + 1]} if "--name" in line else {}
        jobs.append(job(proj, line[line.index("--") + 1:], **options))
    assert [(j["name"], j["launcher"], j["gpus"]) for j in jobs] == [
        ("train", "torchrun", 8), ("llama", "deepspeed", 8), ("train", "torchrun", 8)]
    assert jobs[1]["deepspeed_config"] == "ds_config.json"
