"""`spx submit [OPTIONS] -- COMMAND`: the torchrun/deepspeed/python line a user already runs, as a job file.

    spx submit -- torchrun --nproc_per_node=8 --nnodes=1 train.py --batch_size 32 --gradient_checkpointing
    spx submit --name llama -- deepspeed --num_gpus=8 train.py --deepspeed ds_config.json
    spx submit --dry-run -- torchrun --nproc_per_node=2 train.py      # print the job file, submit nothing

`launch_cmdline` reads the command line; this module decides what it means on this host and writes
the job file: the job runs in the current directory (the script path stays relative to it), in the
Python environment of the `torchrun`/`deepspeed`/`python` the user named (found on their PATH; a
`python:` line when that is not spx's own), on as many GPUs as the line asks for workers when the
daemon has GPUs, else as a CPU job with that many workers (`--gpus` overrides either way). The text
is validated by the daemon's own parser before anything is written, and what `--dry-run` prints is
exactly what a submit drops into the spool, with a comment header saying how it was made.
Contract: `job_from_command` returns (spec, text) or raises CommandLineError saying why and what to do.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path, PurePath
from typing import Any

import yaml

from spx.daemon.cli.launch_cmdline import CommandLineError, Launch, parse_command
from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.spec import NAME_RE, JobSpec, SpecError, parse_spec
from spx.daemon.service import control

SHEBANG_BYTES = 4096
# pip/distlib's launcher for an interpreter path too long for `#!`: a shell line that execs it.
TRAMPOLINE_RE = re.compile(rb"""^'''exec' (?:"([^"]+)"|(\S+)) "\$0" "\$@"$""", re.M)
COMMAND_ONLY_OPTIONS = ("name", "gpus", "checkpoints", "dry_run")


@dataclass(frozen=True)
class Options:
    """`spx submit`'s own options for a command line."""

    name: str | None = None
    gpus: int | list[int] | None = None
    checkpoints: str | None = None
    fresh: bool = False


@dataclass(frozen=True)
class Host:
    """What the translation depends on outside the command line: where it is run (`cwd`), the
    caller's PATH, spx's own interpreter, and the GPUs the daemon has (`gpus`; `gpus_seen_by` says
    whose view that is, for the notes)."""

    cwd: Path
    path: str
    own_python: str
    gpus: int
    gpus_seen_by: str


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """`spx … submit [OPTIONS] -- COMMAND…` as (spx's own arguments, COMMAND); COMMAND is None when
    there is no `--` after `submit` (argparse would read the launcher's flags as spx's)."""
    if "--" in argv and "submit" in argv[:argv.index("--")]:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, None


def gpus_option(text: str) -> int | list[int]:
    """`--gpus 8` or `--gpus 0,1,2,3` (an explicit list of GPU indices)."""
    parts = text.split(",")
    if not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: a count (8) or a list of GPU indices (0,1,2,3)")
    return [int(p) for p in parts] if "," in text else int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `spx submit [OPTIONS] -- COMMAND`."""
    parser.usage = ("spx submit [--fresh] [--check] [--parsable | --json] FILE\n       spx submit [--name N] [--gpus G] [--checkpoints DIR] "
                    "[--dry-run] [--fresh] -- torchrun|deepspeed|python …")
    parser.add_argument("--name", help="with -- COMMAND: the job's name (default: the script's, e.g. train)")
    parser.add_argument("--gpus", type=gpus_option,
                        help="with -- COMMAND: GPUs, a count or a list 0,1 (default: one per worker if the daemon "
                             "has GPUs, else 0: a CPU job)")
    parser.add_argument("--checkpoints", metavar="DIR", help="with -- COMMAND: the checkpoint dir (checkpoints.dir)")
    parser.add_argument("--dry-run", action="store_true",
                        help="with -- COMMAND: print the job file that would be submitted, submit nothing")


def is_command_submit(args: argparse.Namespace) -> bool:
    """Whether `spx submit` was given a command line (or options only a command line takes, or no
    job file at all) rather than a job file alone."""
    return (args.file is None or getattr(args, "launch_argv", None) is not None
            or any(getattr(args, o, None) not in (None, False) for o in COMMAND_ONLY_OPTIONS))


def submit_command(cfg: DaemonConfig, args: argparse.Namespace, drop: Callable[[JobSpec, str], int]) -> int:
    """`spx submit [OPTIONS] -- COMMAND`: print the job file (`--dry-run`) or `drop` it into the spool."""
    command = getattr(args, "launch_argv", None)
    if command is None:
        if args.file is None:
            raise CommandLineError("give a job file (`spx submit job.yaml`) or the command line you would run "
                                   "(`spx submit -- torchrun --nproc_per_node=8 train.py …`)")
        raise CommandLineError("--name, --gpus, --checkpoints and --dry-run go with a command line: "
                               "`spx submit [OPTIONS] -- torchrun …` (a job file says all of these itself)")
    if args.file is not None:
        raise CommandLineError(f"give a job file ({args.file}) or `-- COMMAND`, not both")
    options = Options(name=args.name, gpus=args.gpus, checkpoints=args.checkpoints, fresh=args.fresh)
    spec, text, notes = job_from_command(command, options, probe_host(cfg))
    if args.dry_run:
        print(text, end="")
        return 0
    for note in notes:
        print(f"spx submit: {note}", file=sys.stderr)
    return drop(spec, text)


def probe_host(cfg: DaemonConfig) -> Host:
    """This caller's directory and PATH, and the daemon's GPUs: asked over its socket; if it is not
    running, found the way it will find them (its configured GPU backend)."""
    own = Host(Path(os.getcwd()), os.environ.get("PATH", os.defpath), sys.executable, 0, "")
    try:
        reply = control.request(cfg.socket_path, "gpus", timeout=5.0)
        if reply.get("ok") and isinstance(reply.get("result"), list):
            return replace(own, gpus=len(reply["result"]), gpus_seen_by="the daemon")
    except OSError:
        pass
    from spx.daemon.gpu.backend import GpuBackendError, open_backend  # NVML only when the daemon is not up

    try:
        with open_backend(cfg.gpu_backend, cfg.fake_gpus) as backend:
            return replace(own, gpus=len(backend.devices()), gpus_seen_by=f"this host (GPU backend {backend.kind}; the daemon is not running)")
    except GpuBackendError as e:
        raise CommandLineError(f"cannot tell how many GPUs this host has: {e}; give --gpus N") from e


def job_from_command(command: list[str], options: Options, host: Host) -> tuple[JobSpec, str, list[str]]:
    """(the validated spec, the job file's text, the notes on what was decided) for `command`."""
    launch = parse_command(command)
    data, notes = translate(launch, options, host)
    text = render(data, command, notes, host.cwd)
    try:
        spec = parse_spec(text)
    except SpecError as e:
        raise CommandLineError("the job this makes is not valid: " + "; ".join(
            f"{field}: {msg}" if field else msg for _line, field, msg in e.problems)) from None
    if spec != JobSpec.model_validate(data):  # the YAML must read back as what was meant, quoting included
        raise CommandLineError(f"the job file does not read back as written (a bug in spx submit):\n{text}")
    return spec, text, notes


def translate(launch: Launch, options: Options, host: Host) -> tuple[dict[str, Any], list[str]]:
    """The job spec's fields for `launch` on `host`, and notes on what was decided and why."""
    notes: list[str] = []
    data: dict[str, Any] = {"name": options.name or default_name(launch), "launcher": launch.launcher,
                            "workdir": str(host.cwd)}
    python, why = interpreter(launch, host)
    if python is not None:
        data["python"] = python
    if why:
        notes.append(why)
    if launch.script is not None:
        _must_exist(host.cwd, launch.script, "script")
        data["script"] = launch.script
    else:
        data["module"] = launch.module
    if launch.args:
        data["args"] = list(launch.args)
    if launch.deepspeed_config is not None:
        _must_exist(host.cwd, launch.deepspeed_config, "DeepSpeed config")
        data["deepspeed_config"] = launch.deepspeed_config
    gpus, procs, why = resources(launch, options.gpus, host)
    data["gpus"] = gpus
    if procs is not None:
        data["procs"] = procs
    notes.append(why)
    checkpoints: dict[str, Any] = {}
    if options.checkpoints:
        checkpoints["dir"] = os.path.normpath(os.path.join(host.cwd, os.path.expanduser(options.checkpoints)))
    if options.fresh:
        checkpoints["resume"] = "never"
        notes.append("--fresh: checkpoints already in the checkpoint dir are set aside, not resumed")
    if checkpoints:
        data["checkpoints"] = checkpoints
    return data, notes


def default_name(launch: Launch) -> str:
    """The script's name (`examples/train_ddp.py` → `train_ddp`) or the module's, made a valid job name."""
    base = PurePath(launch.script).stem if launch.script is not None else str(launch.module)
    name = re.sub(r"[^a-z0-9_.-]+", "-", base.lower()).lstrip("-_.")[:63]
    return name if NAME_RE.match(name) else "job"


def interpreter(launch: Launch, host: Host) -> tuple[str | None, str]:
    """The `python:` the job needs to run where the named program runs (None: spx's own
    environment, the daemon's default), and a note saying whose environment that is."""
    where = _find_program(launch.program, host)
    python = where if launch.interpreter_given else _shebang_interpreter(where, host)
    if not os.access(python, os.X_OK):
        raise CommandLineError(f"{launch.program} runs {python}, which is not an executable here")
    if Path(python).parent == Path(os.path.abspath(host.own_python)).parent:
        return None, ""
    if launch.interpreter_given:
        return python, f"python: {python}, as given (not spx's own {host.own_python})"
    return python, (f"python: {python}, the interpreter of {where}: the job runs in that environment "
                    f"(not spx's own {host.own_python})")


def _find_program(program: str, host: Host) -> str:
    if "/" in program:
        found: str | None = os.path.join(host.cwd, program)
    else:
        found = shutil.which(program, path=host.path)
    if found is None or not os.path.isfile(found):
        raise CommandLineError(f"{program}: not found{'' if '/' in program else ' on PATH'}; activate the "
                               "environment you run it from, or give its path")
    return os.path.normpath(os.path.join(host.cwd, found))


def _shebang_interpreter(program: str, host: Host) -> str:
    """The Python a console script (`torchrun`, `deepspeed`) runs with, from its `#!` line: a path,
    `/usr/bin/env python3` (looked up on the caller's PATH), or pip's `/bin/sh` trampoline for long paths."""
    try:
        with open(program, "rb") as f:
            head = f.read(SHEBANG_BYTES)
    except OSError as e:
        raise CommandLineError(f"{program}: {e.strerror}") from e
    words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split() if head.startswith(b"#!") else []
    if words and PurePath(words[0]).name == "env":
        names = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        found = shutil.which(names[0], path=host.path) if names else None
        if found is not None:
            return os.path.normpath(os.path.join(host.cwd, found))
    elif words and PurePath(words[0]).name in ("sh", "bash") and (m := TRAMPOLINE_RE.search(head)):
        return (m.group(1) or m.group(2)).decode(errors="replace")
    elif words and PurePath(words[0]).name.startswith("python"):
        return words[0]
    raise CommandLineError(f"cannot tell which Python {program} runs (its first line is not a `#!` naming one); "
                           "give the interpreter instead: `spx submit -- /path/to/python -m torch.distributed.run "
                           "…` (or `-m deepspeed.launcher.runner`)")


def _must_exist(cwd: Path, path: str, what: str) -> None:
    if not os.path.isfile(os.path.join(cwd, path)):
        raise CommandLineError(f"{what} {path}: no such file in {cwd} (the job runs there, in the directory "
                               "`spx submit` is run from)")


def _count(gpus: int | list[int]) -> int:
    return len(gpus) if isinstance(gpus, list) else gpus


def resources(launch: Launch, asked: int | list[int] | None, host: Host) -> tuple[int | list[int], int | None, str]:
    """(gpus, procs or None for the spec's default, a note). The command line's worker count is the
    job's; GPUs: `--gpus` if given, deepspeed's `--include` list, else one per worker when the daemon
    has GPUs (what the line does on a GPU host) and none when it has none (a CPU job, gloo)."""
    n, kind = launch.procs, launch.launcher
    if launch.gpu_list is not None:
        if asked is not None and asked != launch.gpu_list:
            raise CommandLineError(f"--gpus {asked} and deepspeed --include localhost:{_indices(launch.gpu_list)} "
                                   "disagree; give one of them")
        return launch.gpu_list, None, f"gpus: {launch.gpu_list} (deepspeed --include)"
    if asked is not None:
        gpus, why = asked, f"gpus: {asked} (--gpus)"
    elif host.gpus:
        gpus = {"torchrun": n or 1, "deepspeed": n or host.gpus, "python": 1}[kind]
        why = (f"gpus: {gpus}, one per worker: {host.gpus_seen_by} has {host.gpus} GPUs "
               "(--gpus 0 for a CPU job, --gpus N for another count)")
        if kind == "python":
            why = f"gpus: 1 for one python process: {host.gpus_seen_by} has {host.gpus} GPUs (--gpus N for more)"
    else:
        gpus, why = 0, (f"a CPU job: {host.gpus_seen_by} has no GPUs "
                        "(--gpus N to ask for GPUs all the same)")
    count = _count(gpus)
    if kind == "deepspeed" and n is not None and count and n != count:
        raise CommandLineError(f"--gpus {asked} and deepspeed --num_gpus={n} disagree: deepspeed runs one worker "
                               "per GPU")
    if kind == "deepspeed" and not count and n is None:
        raise CommandLineError(f"deepspeed without --num_gpus runs on every GPU, and this job gets none ({why}); "
                               "give --num_gpus N for N workers")
    procs = None if kind == "python" else (n or (count if kind == "deepspeed" else 1))
    default = 1 if kind == "python" else max(1, count)
    if procs is not None and procs != default:
        return gpus, procs, f"{why}; {procs} worker{'s' if procs > 1 else ''}"
    return gpus, None, why


def _indices(gpus: list[int]) -> str:
    return ",".join(map(str, gpus))


def render(data: dict[str, Any], command: list[str], notes: list[str], cwd: Path) -> str:
    """The job file: a header saying how it was made, then the fields in a reader's order."""
    header = [f"spx submit -- {shlex.join(command)}", f"translated in {cwd} by `spx submit --`:",
              *(f"  {n}" for n in notes)]
    # Block style throughout: a file a user edits (adds a key to) as the README says; flow style
    # would print a job without lists as one `{name: …, launcher: …}` line.
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True, width=100)
    return "".join(f"# {_printable(line)}\n" for line in header) + body


def _printable(text: str) -> str:
    """A comment line the YAML reader accepts: control characters (a newline in an argument) escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
