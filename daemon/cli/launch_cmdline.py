"""What a `torchrun`, `deepspeed` or `python` command line says, for `spx submit -- COMMAND`.

    spx submit -- torchrun --nproc_per_node=8 --nnodes=1 train.py --batch_size 32 --gradient_checkpointing
    spx submit -- deepspeed --num_gpus=8 train.py --deepspeed ds_config.json

Contract: `parse_command(argv)` returns a `Launch` or raises `CommandLineError`, for any argv. Every
launcher flag is either translated or refused with a message that names the flag and what to use
instead (a job spec field, or why the daemon does it itself); none is dropped silently, and an
unknown one is an error (the launcher would have refused it too, or it is a newer flag spx does not
know yet). Everything after the script is the script's own and is kept as it is, in order. Pure: no
files, no environment, no host; `submit_cmdline` decides GPUs, paths and the interpreter.

Flags are matched exactly as spelled out (torchrun's `-` and `_` forms both), `--flag value` or
`--flag=value`; argparse's unique-prefix abbreviations are not taken.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Literal

from spx.daemon.run.launcher import deepspeed_config_in

LauncherName = Literal["torchrun", "deepspeed", "python"]

# `python -m MODULE` forms that are a launcher, not the job's own module.
TORCHRUN_MODULE = "torch.distributed.run"
DEEPSPEED_MODULE = "deepspeed.launcher.runner"
PYTHON_RE = re.compile(r"^python(\d+(\.\d+)?)?$")
# A job file is the way to everything `spx submit --` does not translate; the dry run gives a start.
JOB_FILE_HINT = "write a job file instead (`spx submit --dry-run -- COMMAND > job.yaml` gives one to edit)"


class CommandLineError(Exception):
    """A command line `spx submit --` cannot turn into a job; the message says why and what to do."""


@dataclass(frozen=True)
class Launch:
    """A launcher command line as read, host-independent.

    `program` is the command as given (`torchrun`, `/venv/bin/deepspeed`, `python3`); `interpreter_given`
    is true when `program` is the Python interpreter itself (`python train.py`, `python -m
    torch.distributed.run …`) rather than a launcher's console script. `procs` is the worker count the
    line asks for (torchrun `--nproc_per_node`, deepspeed `--num_gpus`), None if it does not say;
    `gpu_list` is deepspeed's `--include localhost:0,1`. `deepspeed_config` is the config file the
    script's arguments name (they stay in `args` as they are)."""

    launcher: LauncherName
    program: str
    interpreter_given: bool
    script: str | None
    module: str | None
    args: list[str] = field(default_factory=list)
    procs: int | None = None
    gpu_list: list[int] | None = None
    deepspeed_config: str | None = None


@dataclass(frozen=True)
class _Flag:
    """One launcher flag: whether it takes a value, and either what it sets (`sets`) or why it is refused."""

    takes_value: bool
    sets: str | None = None
    refusal: str | None = None


RENDEZVOUS = "the daemon sets the rendezvous itself (127.0.0.1 and a free port for each attempt); drop it"
RESTARTS = ("the daemon relaunches failed attempts itself, with backoff (the launcher runs with no restarts "
            "of its own); set restart.max_restarts in a job file instead")
LOGS = ("the daemon keeps every rank's output, rank-prefixed, in the attempt's log (`spx logs NAME`) and the "
        "per-rank files beside it; drop it")
MULTI_NODE = ("multi-node jobs are not translated from a command line: write a job file with nodes.count, "
              "nodes.rdzv_endpoint and a shared checkpoints.dir, and submit it on every host (docs/multinode.md)")
MONITOR = ("the daemon watches the attempt itself (exit, heartbeat, hangs: restart.hang_timeout_seconds); "
           "drop it")
NOT_TRANSLATED = f"not something `spx submit --` translates; {JOB_FILE_HINT}"


def _flags(*entries: tuple[tuple[str, ...], _Flag]) -> dict[str, _Flag]:
    return {name: flag for names, flag in entries for name in names}


def _both(name: str) -> tuple[str, ...]:
    """torchrun's two spellings of a flag: `--nproc-per-node` and `--nproc_per_node`."""
    return (name, name.replace("-", "_").replace("__", "--", 1))


TORCHRUN_FLAGS = _flags(
    (_both("--nproc-per-node"), _Flag(True, sets="procs")),
    (("--nnodes",), _Flag(True, sets="nnodes")),
    (_both("--node-rank"), _Flag(True, sets="node_rank")),
    (("--standalone",), _Flag(False, sets="standalone")),
    (("-m", "--module"), _Flag(False, sets="module")),
    (_both("--rdzv-backend") + _both("--rdzv-endpoint") + _both("--rdzv-id") + _both("--rdzv-conf")
     + _both("--master-addr") + _both("--master-port") + _both("--local-addr"), _Flag(True, refusal=RENDEZVOUS)),
    (_both("--max-restarts"), _Flag(True, refusal=RESTARTS)),
    (_both("--monitor-interval"), _Flag(True, refusal=MONITOR)),
    (("-r", "--redirects", "-t", "--tee") + _both("--log-dir") + _both("--local-ranks-filter")
     + _both("--duplicate-stdout-filters") + _both("--duplicate-stderr-filters") + _both("--logs-specs"),
     _Flag(True, refusal=LOGS)),
    (_both("--no-python"), _Flag(False, refusal="the daemon runs the script with Python (the job spec's "
                                               "`python` picks which); a non-Python program needs a job file")),
    (_both("--run-path"), _Flag(False, refusal="the daemon runs the script as a file; drop it")),
    (_both("--start-method") + _both("--event-log-handler") + ("--role",) + _both("--numa-binding")
     + _both("--signals-to-handle") + _both("--shutdown-timeout"), _Flag(True, refusal=NOT_TRANSLATED)),
    (_both("--virtual-local-rank") + ("-h", "--help"), _Flag(False, refusal=NOT_TRANSLATED)),
)

DEEPSPEED_FLAGS = _flags(
    (("--num_gpus", "--num_accelerators"), _Flag(True, sets="procs")),
    (("-i", "--include"), _Flag(True, sets="include")),
    (("--num_nodes",), _Flag(True, sets="nnodes")),
    (("--node_rank",), _Flag(True, sets="node_rank")),
    (("--master_port", "--master_addr"), _Flag(True, refusal=RENDEZVOUS)),
    (("-H", "--hostfile", "--launcher", "--launcher_args", "--ssh_port", "--min_elastic_nodes",
      "--max_elastic_nodes"), _Flag(True, refusal=MULTI_NODE)),
    (("--no_ssh", "--no_ssh_check", "--force_multi", "--elastic_training"), _Flag(False, refusal=MULTI_NODE)),
    (("-e", "--exclude"), _Flag(True, refusal="list the GPUs to use instead: `--include localhost:0,1` or "
                                              "`spx submit --gpus 0,1` (the job spec's gpus: [0, 1])")),
    (("--module",), _Flag(False, refusal="launcher: deepspeed runs a script, not a module; run the module "
                                         "with torchrun -m")),
    (("--no_python",), _Flag(False, refusal="the daemon runs the script with Python (the job spec's `python` "
                                            "picks which); a non-Python program needs a job file")),
    (("--no_local_rank",), _Flag(False, refusal="the daemon's deepspeed launch passes --local_rank to each "
                                                "worker; let the script accept it and drop the flag")),
    (("--enable_each_rank_log",), _Flag(True, refusal=LOGS)),
    (("--autotuning", "--bind_core_list", "--venv_script", "--log_level", "--comment"),
     _Flag(True, refusal=NOT_TRANSLATED)),
    (("--save_pid", "--bind_cores_to_rank", "-q", "--quiet", "-h", "--help"), _Flag(False, refusal=NOT_TRANSLATED)),
)

TORCHRUN_TRANSLATED = "--nproc_per_node, --nnodes=1, --standalone, --node_rank=0 and -m/--module"
DEEPSPEED_TRANSLATED = "--num_gpus, --include localhost:GPUS, --num_nodes=1 and --node_rank=0"

# Interpreter options `python -X … script` may carry: -u only (the daemon runs workers unbuffered anyway).
PYTHON_HARMLESS = {"-u"}


def parse_command(argv: list[str]) -> Launch:
    """The job `argv` (a torchrun, deepspeed or python command line) describes; see the module doc."""
    if not argv:
        raise CommandLineError("no command after `--`: give the torchrun, deepspeed or python command line "
                               "you would run by hand")
    program, rest = argv[0], argv[1:]
    kind = PurePath(program).name
    if kind == "torchrun":
        return _torchrun(program, rest, interpreter_given=False)
    if kind == "deepspeed":
        return _deepspeed(program, rest, interpreter_given=False)
    if PYTHON_RE.match(kind):
        return _python(program, rest)
    raise CommandLineError(f"`{program}` is not torchrun, deepspeed or python: `spx submit --` takes the command "
                           f"line of one of those; for anything else, {JOB_FILE_HINT}")


def _options(launcher: str, flags: dict[str, _Flag], translated: str,
             tokens: list[str]) -> tuple[dict[str, str], list[str]]:
    """The launcher's own options (what each sets: its value, or "" for a switch) and the tokens from
    the script on. Refused and unknown flags raise CommandLineError."""
    found: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "--":
            i += 1
            break
        if not tok.startswith("-") or tok == "-":
            break
        name, eq, inline = tok.partition("=") if tok.startswith("--") else (tok, "", "")
        if name not in flags and not tok.startswith("--") and tok[:2] in flags and flags[tok[:2]].takes_value:
            name, eq, inline = tok[:2], "=", tok[2:]  # `-r3`: a short option with its value attached
        flag = flags.get(name)
        if flag is None:
            raise CommandLineError(f"{launcher} {name}: unknown flag (`spx submit --` translates {translated}); "
                                   f"{JOB_FILE_HINT}")
        if flag.refusal:
            raise CommandLineError(f"{launcher} {name}: {flag.refusal}")
        assert flag.sets is not None
        if flag.takes_value:
            if not eq:
                if i + 1 >= len(tokens):
                    raise CommandLineError(f"{launcher} {name}: needs a value")
                inline = tokens[i + 1]
                i += 1
            found[flag.sets] = inline
        elif eq:
            raise CommandLineError(f"{launcher} {name}: takes no value")
        else:
            found[flag.sets] = ""
        i += 1
    return found, tokens[i:]


def _count(launcher: str, flag: str, value: str, what: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 512:
        raise CommandLineError(f"{launcher} {flag}={value}: give {what} as a number from 1 to 512 "
                               "(the job spec's procs/gpus)")
    return int(value)


def _single_node(launcher: str, found: dict[str, str]) -> None:
    nnodes = found.get("nnodes")
    if nnodes is not None and nnodes not in ("1", "1:1"):
        raise CommandLineError(f"{launcher} nodes={nnodes}: {MULTI_NODE}")
    rank = found.get("node_rank")
    if rank is not None and rank != "0":
        raise CommandLineError(f"{launcher} node rank {rank}: {MULTI_NODE}")


def _script(launcher: str, rest: list[str]) -> tuple[str, list[str]]:
    if not rest:
        raise CommandLineError(f"{launcher}: no script to run after its flags")
    return rest[0], rest[1:]


def _torchrun(program: str, tokens: list[str], interpreter_given: bool) -> Launch:
    found, rest = _options("torchrun", TORCHRUN_FLAGS, TORCHRUN_TRANSLATED, tokens)
    _single_node("torchrun", found)
    procs = found.get("procs")
    if procs in ("gpu", "auto", "cpu"):
        raise CommandLineError(f"torchrun --nproc_per_node={procs}: give the number of workers "
                               "(--nproc_per_node=8); the daemon allocates GPUs by count")
    target, args = _script("torchrun", rest)
    module = "module" in found
    return Launch("torchrun", program, interpreter_given, script=None if module else target,
                  module=target if module else None, args=args,
                  procs=_count("torchrun", "--nproc_per_node", procs, "the workers per node") if procs else None)


def _deepspeed(program: str, tokens: list[str], interpreter_given: bool) -> Launch:
    found, rest = _options("deepspeed", DEEPSPEED_FLAGS, DEEPSPEED_TRANSLATED, tokens)
    _single_node("deepspeed", found)
    procs, include = found.get("procs"), found.get("include")
    if procs is not None and include is not None:
        raise CommandLineError("deepspeed: give --num_gpus or --include, not both (deepspeed refuses them together)")
    script, args = _script("deepspeed", rest)
    config = deepspeed_config_in(args)
    if config is None:
        raise CommandLineError("deepspeed: the script's arguments name no DeepSpeed config; the daemon needs it "
                               "(the job spec's deepspeed_config): add `--deepspeed ds_config.json` or "
                               "`--deepspeed --deepspeed_config ds_config.json` after the script")
    return Launch("deepspeed", program, interpreter_given, script=script, module=None, args=args,
                  procs=_count("deepspeed", "--num_gpus", procs, "the GPUs") if procs is not None else None,
                  gpu_list=_include(include) if include is not None else None, deepspeed_config=config)


def _include(value: str) -> list[int] | None:
    """deepspeed `--include localhost:0,1` as a GPU list; `localhost` alone (every GPU) as None."""
    host, _, slots = value.partition(":")
    if "@" in value or host != "localhost":
        raise CommandLineError(f"deepspeed --include {value}: only `localhost:GPU,GPU…` (one host) is "
                               f"translated; {MULTI_NODE}")
    if not slots:
        return None
    parts = slots.split(",")
    if not all(p.isdigit() for p in parts):
        raise CommandLineError(f"deepspeed --include {value}: expected localhost:0,1,… (GPU indices)")
    return [int(p) for p in parts]


def _python(program: str, tokens: list[str]) -> Launch:
    """`python [-u] script …`, `python -m module …`, and the launchers run as modules
    (`python -m torch.distributed.run …`, `python -m deepspeed.launcher.runner …`)."""
    i = 0
    while i < len(tokens) and tokens[i] in PYTHON_HARMLESS:
        i += 1
    if i == len(tokens):
        raise CommandLineError(f"{program}: no script or -m module to run")
    tok = tokens[i]
    if tok == "-m" and i + 1 == len(tokens):
        raise CommandLineError(f"{program} -m: needs a module to run")
    module = tokens[i + 1] if tok == "-m" and i + 1 < len(tokens) else tok[2:] if tok.startswith("-m") else None
    rest = tokens[i + (2 if tok == "-m" else 1):]
    if module == TORCHRUN_MODULE:
        return _torchrun(program, rest, interpreter_given=True)
    if module == DEEPSPEED_MODULE:
        return _deepspeed(program, rest, interpreter_given=True)
    if module == "torch.distributed.launch":
        raise CommandLineError("python -m torch.distributed.launch: deprecated by PyTorch; write it as "
                               "torchrun (the same flags, without --use-env)")
    if module:
        return Launch("python", program, True, script=None, module=module, args=rest)
    if tok.startswith("-"):
        raise CommandLineError(f"{program} {tok}: interpreter options are not translated (only -u); "
                               f"{JOB_FILE_HINT}")
    return Launch("python", program, True, script=tok, module=None, args=rest)
