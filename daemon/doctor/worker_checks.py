"""`spx doctor`'s job-environment checks: the interpreter jobs run (`python:` in a job file, by
default the daemon's own venv) imports torch and DeepSpeed and sees the GPUs (`worker-env`), and an
unprivileged user can run it at all (`worker-access`): jobs run as their owners, so a venv built
from a python under a private directory (a pyenv in root's 0700 home) works for root alone, and
every other user's job fails to launch."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
from typing import TYPE_CHECKING, Any

from spx.daemon.doctor.check import Check

if TYPE_CHECKING:
    from spx.daemon.doctor.report import DoctorContext

_PROBE = r"""
import importlib, json, sys
out = {"python": sys.version.split()[0]}
for name in ("torch", "deepspeed"):
    try:
        mod = importlib.import_module(name)
        out[name] = mod.__version__
        if name == "torch":
            out["cuda"] = mod.version.cuda
            out["cuda_devices"] = mod.cuda.device_count() if mod.version.cuda else 0
    except Exception as e:
        out[name + "_error"] = f"{type(e).__name__}: {e}"
print("SPX_DOCTOR=" + json.dumps(out), flush=True)
"""


def worker_check(python: str, facts: dict[str, Any], gpus: int, fake: bool) -> Check:
    """Judge what the probe printed, given how many GPUs the backend sees."""
    fix_torch = f"{python} -m pip install 'spx-trainer[train]' (CPU-only host: torch from the CPU index first)"
    if "torch" not in facts:
        return Check("worker-env", "fail", f"torch is not importable by {python}: {facts.get('torch_error')}", fix_torch)
    torch_s = f"torch {facts['torch']}" + (f" (CUDA {facts['cuda']})" if facts.get("cuda") else " (CPU-only build)")
    ds = f"deepspeed {facts['deepspeed']}" if "deepspeed" in facts else None
    detail = f"{python} (Python {facts['python']}): {torch_s}, {ds or 'no deepspeed'}"
    if gpus and not fake:
        if not facts.get("cuda"):
            return Check("worker-env", "fail", detail + f", but this host has {gpus} GPUs",
                         f"install a CUDA build of torch into {python} (pip install torch --index-url "
                         "https://download.pytorch.org/whl/cu124)")
        if facts.get("cuda_devices") != gpus:
            return Check("worker-env", "fail", detail + f": torch sees {facts.get('cuda_devices')} of {gpus} GPUs",
                         "the driver may be older than torch's CUDA needs; compare `nvidia-smi` with torch.version.cuda")
    if gpus and fake:
        detail += " (fake GPUs: workers run on CPU)"
    if ds is None:
        return Check("worker-env", "warn", detail + f"; deepspeed: {facts.get('deepspeed_error')}",
                     f"{python} -m pip install deepspeed (needed only for launcher: deepspeed)")
    return Check("worker-env", "ok", detail)


def check_worker(ctx: DoctorContext) -> Check:
    python = ctx.worker_python
    if not python:
        return Check("worker-env", "unknown", "no worker python configured", "set `python:` in the job spec")
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/"), "LANG": "C.UTF-8"}
    try:
        r = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=ctx.worker_timeout_s, env=env)
    except FileNotFoundError:
        return Check("worker-env", "fail", f"worker python {python} does not exist", "set `python:` in the job spec")
    except subprocess.TimeoutExpired:
        return Check("worker-env", "unknown", f"{python}: importing torch/deepspeed took over {ctx.worker_timeout_s:.0f} s",
                     "run the probe by hand: python -c 'import torch, deepspeed'")
    line = next((x for x in r.stdout.splitlines() if x.startswith("SPX_DOCTOR=")), None)
    if line is None:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return Check("worker-env", "fail", f"{python} failed (exit {r.returncode}): {tail}", "run it by hand to see why")
    b = ctx.backend
    gpus = len(b.devices()) if b is not None and b.nvml is not None else 0
    return worker_check(python, json.loads(line.removeprefix("SPX_DOCTOR=")), gpus, getattr(b, "kind", "") == "fake")


# Run as an unprivileged user: does the interpreter start, and does it find torch? (A venv that root
# alone can read starts, then imports nothing.) find_spec only looks, so this takes no time.
_ACCESS_PROBE = ("import importlib.util, sys; "
                 "print('SPX_ACCESS', sys.version.split()[0], importlib.util.find_spec('torch') is not None)")
ACCESS_TIMEOUT_SECONDS = 30.0


def unprivileged_user(euid: int) -> tuple[str, int, int] | None:
    """(name, uid, gid) to run the probe as: `nobody` when root runs doctor, else the caller itself
    (already an unprivileged user). None when there is no `nobody`."""
    if euid != 0:
        try:
            return pwd.getpwuid(euid).pw_name, euid, os.getegid()
        except KeyError:
            return f"uid {euid}", euid, os.getegid()
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return "nobody", nobody.pw_uid, nobody.pw_gid


def worker_access_check(python: str, who: str, version: str | None, torch_found: bool, error: str = "") -> Check:
    """Judge the probe: `version` None means the interpreter did not run as `who` (`error` says why)."""
    if version is None:
        return Check("worker-access", "fail", f"{who} cannot run {python}: {error}; every job of a user other "
                     "than root would fail to launch",
                     "build the job environment from a python every user can run (systemd/install.sh picks one "
                     "and checks it; a pyenv under /root is 0700), or give jobs their own `python:`")
    if not torch_found:
        return Check("worker-access", "fail", f"{python} runs as {who} (Python {version}) but finds no torch",
                     "make the environment readable by every user (pip under umask 077 makes files root's alone: "
                     "chmod -R a+rX on the venv) and install torch into it")
    return Check("worker-access", "ok", f"{python} runs as {who} (Python {version}) and finds torch")


def check_worker_access(ctx: DoctorContext) -> Check:
    python = ctx.worker_python
    if not python:
        return Check("worker-access", "unknown", "no worker python configured", "set `python:` in the job spec")
    user = unprivileged_user(os.geteuid())
    if user is None:
        return Check("worker-access", "unknown", "no user `nobody` to try the job environment as",
                     f"run `{python} -c pass` as an ordinary user")
    who, uid, gid = user
    switch: dict[str, Any] = {"user": uid, "group": gid, "extra_groups": []} if os.geteuid() == 0 else {}
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/", "LANG": "C.UTF-8"}
    try:
        r = subprocess.run([python, "-I", "-c", _ACCESS_PROBE], capture_output=True, text=True, cwd="/", env=env,
                           stdin=subprocess.DEVNULL, timeout=ACCESS_TIMEOUT_SECONDS, **switch)
    except subprocess.TimeoutExpired:
        return Check("worker-access", "unknown", f"{python} did not start within {ACCESS_TIMEOUT_SECONDS:.0f} s as {who}",
                     f"run `{python} -c pass` as an ordinary user")
    except OSError as e:
        return worker_access_check(python, who, None, False, f"{e.strerror or e} ({type(e).__name__})")
    words = next((ln.split() for ln in r.stdout.splitlines() if ln.startswith("SPX_ACCESS ")), None)
    if r.returncode != 0 or words is None or len(words) != 3:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return worker_access_check(python, who, None, False, f"exit {r.returncode}: {tail}")
    return worker_access_check(python, who, words[1], words[2] == "True")
