"""`spx schema`: the job file's JSON Schema, for editors (completion, hover text and checks while a
job file is written), made from the same pydantic model the daemon parses with (core/spec.py), so it
cannot drift from what is accepted.

    spx schema --output ~/.config/spx/job.schema.json
    # VS Code (the YAML extension), first line of a job file:
    # yaml-language-server: $schema=/home/me/.config/spx/job.schema.json

What a schema cannot say, the parser still decides at submit (`spx submit --check`): paths as the
owner can reach them, cross-field rules (exactly one of script/module, deepspeed_config with
launcher: deepspeed), the environment variables the daemon reserves.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from spx.daemon.cli.client import EXIT_OK, EXIT_USAGE, CliError
from spx.daemon.core.spec import JobSpec

DIALECT = "https://json-schema.org/draft/2020-12/schema"


def job_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a job file; keys as written in YAML (`data.stage.from`)."""
    schema = JobSpec.model_json_schema(by_alias=True, mode="validation")
    return {"$schema": DIALECT, **schema, "title": "spx-trainer job file"}


def cmd_schema(args: argparse.Namespace) -> int:
    text = json.dumps(job_schema(), indent=2, sort_keys=False) + "\n"
    if args.output is None:
        sys.stdout.write(text)
        return EXIT_OK
    target: Path = args.output
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, target)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CliError(f"{target}: {e.strerror}", EXIT_USAGE) from e
    print(f"wrote {target}", file=sys.stderr)
    return EXIT_OK
