"""The README and its job spec reference stay true to the code: every field of the spec model is
documented in docs/job-spec.md (docs drift fails CI), the README's job file parses as a job, and the
README keeps the two set-up commands and stays short."""

import importlib.util
from pathlib import Path

from pydantic import BaseModel

from spx.daemon.core.spec import JobSpec, parse_spec

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
JOB_SPEC_DOC = (REPO / "docs" / "job-spec.md").read_text()


def _fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    names = []
    for name, info in model.model_fields.items():
        key = info.alias or name
        sub = info.annotation if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel) else None
        if sub is not None and sub.model_fields:
            names += _fields(sub, f"{prefix}{key}.")
        else:
            names.append(prefix + key)
    return names


def test_every_spec_field_is_documented():
    missing = []
    for field in _fields(JobSpec):
        leaf = field.rsplit(".", 1)[-1]
        if f"`{field}" not in JOB_SPEC_DOC and f".{leaf}`" not in JOB_SPEC_DOC and f"`{leaf}`" not in JOB_SPEC_DOC:
            missing.append(field)
    assert not missing, f"docs/job-spec.md's job spec reference lacks: {missing}"


def test_readme_has_the_two_setup_commands():
    assert "make demo" in README and "make test" in README


def test_the_readmes_job_file_is_a_job():
    block = README.split("\n### From a job file\n", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    spec = parse_spec(block)
    assert (spec.name, spec.launcher, spec.gpus, spec.stop.grace_seconds) == ("llama-ft", "torchrun", 8, 120)
    assert spec.resume_args == ["--resume_from_checkpoint", "{resume_from}"]


def test_readme_is_short():
    """The README is read in the order people work; the reference lives in docs/."""
    assert len(README.splitlines()) <= 200


def test_the_demo_ends_with_the_readmes_try_commands():
    """`make demo` tells the user how to go on: its last words are the try section's commands."""
    spec = importlib.util.spec_from_file_location("spx_demo", REPO / "examples" / "demo.py")
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    told = [line.strip() for line in demo.NEXT_STEPS.splitlines() if line.startswith("    ")]
    section = README.split("\n## Try it in 2 minutes", 1)[1].split("\n## ", 1)[0]
    shown = [line.split("  #", 1)[0].strip() for block in section.split("```sh\n")[1:]
             for line in block.split("```", 1)[0].splitlines() if line.strip()]
    assert told and all(line in shown for line in told), (told, shown)
    assert "foreground" in demo.NEXT_STEPS and ".venv/bin/activate" in demo.NEXT_STEPS
