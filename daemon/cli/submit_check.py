"""`spx submit --check job.yaml`: what the daemon would make of a job file, without submitting it.

    spx submit --check job.yaml          # the job as it would be recorded (YAML) and what it would do
    spx submit --check job.yaml --json   # the same as one JSON document

The file is parsed by the daemon's own parser (core/spec.py: relative paths resolved against the
file's directory, as `spx submit` does), given the default checkpoint dir the daemon would give it,
and checked as intake checks it — as the owner, who is the invoking user (intake/access.py). What it
would do: the launcher's argv as planned for attempt 1 (the port and the GPUs are chosen at each
start, so they are shown as `<port>` and as the first N indices), the GPUs asked, the checkpoint dir,
the restart and stop policy. What needs the daemon is not checked here: a live job of the same name,
the `after:` names, the host's GPU count and the queue.

Exit status as `spx submit` would give: 0 valid, 2 the file does not parse (stderr says where), 1 the
daemon would reject it (the owner cannot reach a path it needs).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from spx.daemon.cli.client import EXIT_FAIL, EXIT_OK
from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.restart_spec import ClassLimit
from spx.daemon.core.spec import JobSpec
from spx.daemon.intake.access import access_problems
from spx.daemon.run.launcher import LaunchContext, plan_launch
from spx.daemon.userfs import as_user

PORT_SHOWN = "<port>"
_PORT = 65535  # planned with this port, shown as PORT_SHOWN in the flags that carry it
_PORT_FLAGS = (f"--master-port={_PORT}", f"--master_port={_PORT}")


def planned_argv(cfg: DaemonConfig, spec: JobSpec, user: as_user.Owner) -> tuple[list[str], str]:
    """The launcher's argv and working directory for attempt 1, as the daemon would plan them."""
    gpus = spec.gpus if isinstance(spec.gpus, list) else list(range(spec.gpus))
    ctx = LaunchContext(
        attempt=1, attempt_id="", gpus=gpus, port=_PORT, checkpoint_dir=spec.checkpoint_dir(cfg.checkpoints_root),
        resume_from=None, heartbeat_file=cfg.run_dir / "jobs" / f"ID-{spec.name}" / "heartbeat.json",
        rank_log_dir=cfg.log_dir / spec.name / "attempt-1.ranks", home=user.home, user=user.name)
    plan = plan_launch(spec, ctx)
    argv = [a.replace(str(_PORT), PORT_SHOWN) if a in _PORT_FLAGS else a for a in plan.argv]
    return argv, plan.cwd


def _rule(rule: str | ClassLimit) -> str:
    if isinstance(rule, str):
        return rule
    within = rule.within_first_seconds
    return (f"max {rule.max}" + (f" within the first {within:g} s" if within else "")
            + (", rolled back" if rule.rollback else "") + (f", then with {' '.join(rule.args)}" if rule.args else ""))


def what_it_does(cfg: DaemonConfig, spec: JobSpec, user: as_user.Owner) -> dict[str, Any]:
    argv, cwd = planned_argv(cfg, spec, user)
    r = spec.restart
    return {
        "argv": argv,
        "cwd": cwd,
        "user": user.name,
        "gpus": spec.gpus,
        "workers": spec.worker_count,
        "nodes": spec.nodes.count,
        "checkpoint_dir": str(spec.checkpoint_dir(cfg.checkpoints_root)),
        "resume": spec.checkpoints.resume,
        "keep": spec.checkpoints.keep,
        "restart": {
            "max_restarts": r.max_restarts,
            "backoff_seconds": list(r.backoff_seconds),
            "hang_timeout_seconds": r.hang_timeout_seconds,
            "on_exit_codes": r.on_exit_codes,
            "on_failure": {cls: _rule(rule) for cls, rule in r.on_failure.items()},
        },
        "grace_seconds": spec.stop.grace_seconds,
        "after": list(spec.after),
    }


def describe(plan: dict[str, Any]) -> list[str]:
    """The plan for a person, one line per decision."""
    gpus = plan["gpus"]
    asked = (f"GPUs {','.join(map(str, gpus))}" if isinstance(gpus, list)
             else f"{gpus} GPU{'s' * (gpus != 1)} (any free ones, chosen at each start)" if gpus else "no GPUs (a CPU job)")
    r = plan["restart"]
    first, cap = r["backoff_seconds"]
    hang = (f"hung after {r['hang_timeout_seconds']:g} s without step progress" if r["hang_timeout_seconds"]
            else "hang timeout calibrated from its own step times")
    codes = "any non-zero exit" if r["on_exit_codes"] == "any" else f"exit codes {r['on_exit_codes']}"
    rules = ", ".join(f"{cls} {rule}" for cls, rule in r["on_failure"].items())
    lines = [
        f"run:         {' '.join(plan['argv'])}",
        f"in:          {plan['cwd']}  (as {plan['user']})",
        f"gpus:        {asked}; {plan['workers']} worker{'s' * (plan['workers'] != 1)}"
        + (f" on each of {plan['nodes']} hosts" if plan["nodes"] > 1 else ""),
        f"checkpoints: {plan['checkpoint_dir']} (resume: {plan['resume']}; keep {plan['keep']})",
        f"restart:     {codes}, up to {r['max_restarts']} times, backoff {first:g} s doubling to {cap:g} s; {hang}",
        f"             per failure class: {rules}",
        f"stop:        SIGTERM, {plan['grace_seconds']:g} s to checkpoint, then SIGKILL",
    ]
    if plan["after"]:
        lines.append(f"after:       starts once {', '.join(plan['after'])} succeeded (checked by the daemon)")
    return lines


def normalised(spec: JobSpec) -> dict[str, Any]:
    """The spec as the daemon records it: every field, defaults included, keys as written in YAML."""
    return spec.model_dump(mode="json", by_alias=True)


def check_job(cfg: DaemonConfig, spec: JobSpec, source: Path, as_json: bool) -> int:
    """Print what the daemon would make of `spec` (parsed from `source`); the exit status submit would give."""
    me = as_user.owner(os.getuid())
    spec = spec.with_checkpoint_dir(cfg.checkpoints_root, me.name, me.uid)  # as intake gives it
    problems = access_problems(cfg.checkpoints_root, spec, me.uid)
    plan = what_it_does(cfg, spec, me)
    python = plan["argv"][0]
    warnings = [] if os.access(python, os.X_OK) else [f"python: {python} is not executable by {me.name}: "
                                                     "every launch would fail"]
    if as_json:
        print(json.dumps({"file": str(source), "valid": not problems, "problems": problems, "warnings": warnings,
                          "spec": normalised(spec), "plan": plan}, indent=1))
    else:
        print(f"# {source}: the job as the daemon would record it")
        print(yaml.safe_dump(normalised(spec), sort_keys=False, default_flow_style=False, allow_unicode=True,
                             width=100), end="")
        print("# what it would do (attempt 1):")
        for line in describe(plan):
            print(f"#   {line}")
        for w in warnings:
            print(f"spx submit --check: warning: {w}", file=sys.stderr)
        for p in problems:
            print(f"spx submit --check: the daemon would reject it: {p}", file=sys.stderr)
        if not problems:
            print(f"# {source}: valid; `spx submit {source}` would queue it", file=sys.stderr)
    return EXIT_FAIL if problems else EXIT_OK
