"""`spx verify NAME`: replay NAME's checkpoint intervals on other GPUs and compare every step's numbers
with what its checkpoints recorded (docs/verify.md).

    spx verify train                 # from the oldest checkpoint kept, on as many idle GPUs
    spx verify train --from 4000     # the intervals from step 4000 on
    spx verify train --gpus 4,5      # on these GPUs (as many as the job has)

The daemon writes the replay's job file (intake/replay_file.py); it is submitted here as you, like
`spx submit` does, and queued like any job: it runs when GPUs are free. Its verdict is stored on NAME
(`spx status NAME`), and when it differs NAME is rolled back and the GPU that computed the step is
suspect (`spx gpus`).
"""

from __future__ import annotations

import argparse
import json

from spx.daemon.cli import submit
from spx.daemon.cli.client import ask
from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.spec import parse_spec


def add_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("name", help="the job whose checkpoints to verify")
    s.add_argument("--from", dest="from_step", type=int, metavar="STEP",
                   help="verify the checkpoint intervals from this step on (default: from the oldest kept)")
    s.add_argument("--gpus", type=_gpu_list, metavar="LIST",
                   help="run the replay on these GPUs, e.g. 4,5 (as many as the job has; default: any free ones)")
    s.add_argument("--json", action="store_true", help="print {name, job_id, state} of the replay job")


def _gpu_list(text: str) -> list[int]:
    """`--gpus 4,5` (or `--gpus 4` for a one-GPU job): GPU indices."""
    parts = text.split(",")
    if not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: a list of GPU indices, e.g. 4,5")
    return [int(p) for p in parts]


def cmd_verify(cfg: DaemonConfig, args: argparse.Namespace) -> int:
    text = str(ask(cfg, "replay-spec", args.name, json.dumps({"from_step": args.from_step, "gpus": args.gpus})))
    spec = parse_spec(text)
    return submit.drop(cfg, spec, text, argparse.Namespace(parsable=False, json=args.json),
                       f"the replay of {args.name}")
