"""The job spec reference (the README, or docs/ where parts of it moved) covers every field of the spec
model (docs drift fails CI)."""

from pathlib import Path

from pydantic import BaseModel

from spx.daemon.core.spec import JobSpec

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
REFERENCE = README + "".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))


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
        if f"`{field}" not in REFERENCE and f".{leaf}`" not in REFERENCE and f"`{leaf}`" not in REFERENCE:
            missing.append(field)
    assert not missing, f"the job spec reference (README.md, docs/) lacks: {missing}"


def test_readme_has_the_two_setup_commands():
    assert "make demo" in README and "make test" in README
