"""Property: for ANY text, `parse_spec` returns a JobSpec or raises SpecError -- nothing else -- and a
returned JobSpec holds only finite, int64-sized numbers (issue 12: the daemon is root and the text is a
user's). Three sources of text: YAML built from a small grammar (tags, anchors, odd scalars, deep
nesting, block and flow style), raw random text, and mutations of the shipped example jobs.

Derandomized and bounded (a few seconds in all) so `make test` is stable; a failure prints the input.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spx.daemon.core.spec import JobSpec, SpecError, parse_spec

EXAMPLES = sorted((Path(__file__).parents[2] / "examples" / "jobs").glob("*.yaml"))
FUZZ = settings(
    max_examples=200, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

FIELDS = [
    "name", "launcher", "script", "module", "args", "workdir", "python", "gpus", "procs", "deepspeed_config",
    "env", "nodes", "count", "checkpoints", "dir", "keep", "pattern", "resume_args", "restart", "max_restarts",
    "backoff_seconds", "hang_timeout_seconds", "on_exit_codes", "stop", "grace_seconds", "data", "stage",
    "from", "to", "priority", "<<", "?", "HF_HOME",
]
ODD_SCALARS = [
    ".inf", "-.inf", ".nan", ".NaN", "~", "null", "yes", "no", "on", "off", "maybe", "0x1F", "0o17", "0b101",
    "1:20:30", "1_000", "1.0e+400", "-1.0e+400", "1e400", "9" * 30, "9" * 5000, "-" + "9" * 25, "1.5", "0",
    "-1", "2020-01-01", "2020-01-01T00:00:00Z", "=", "''", '""', '"\\0"', '"\\ud800"', '"\\x01"', '"\\U0010FFFF"',
    "/abs/path", "rel/path", "../x", "train.py", "torchrun", "deepspeed", "python", "any", "ok-name",
]
TAGS = [
    "!!int", "!!float", "!!bool", "!!str", "!!null", "!!seq", "!!map", "!!binary", "!!timestamp", "!!set",
    "!!omap", "!!pairs", "!!merge", "!!value", "!!python/object/apply:os.system", "!!python/name:os.system",
    "!!python/tuple", "!foo", "!", "!<tag:yaml.org,2002:int>", "!<!x>", "!!python/object/new:int",
]
NESTING = ["[" * 3000 + "]" * 3000, "{a: " * 3000 + "1" + "}" * 3000, "[" * 17 + "]" * 17, "[" * 3000, "{" * 40]


def _scalar() -> st.SearchStrategy[str]:
    plain = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\n"), max_size=12)
    tagged = st.tuples(st.sampled_from(TAGS), st.sampled_from(ODD_SCALARS)).map(" ".join)
    anchored = st.tuples(st.sampled_from(["&a", "*a", "&b", "*b"]), st.sampled_from(ODD_SCALARS)).map(" ".join)
    return st.one_of(st.sampled_from(ODD_SCALARS), plain, tagged, anchored, st.integers().map(str),
                     st.floats().map(repr))


def _flow(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    seq = st.lists(children, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]")
    pair = st.tuples(st.one_of(st.sampled_from(FIELDS), children), children).map(lambda kv: f"{kv[0]}: {kv[1]}")
    mapping = st.lists(pair, max_size=4).map(lambda xs: "{" + ", ".join(xs) + "}")
    tagged = st.tuples(st.sampled_from(TAGS), st.one_of(seq, mapping)).map(" ".join)
    return st.one_of(seq, mapping, tagged)


FLOW = st.recursive(_scalar(), _flow, max_leaves=20)


def _block(value: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A block mapping of spec-like keys, some values nested one block level deeper."""
    line = st.tuples(st.sampled_from(FIELDS), value).map(lambda kv: f"{kv[0]}: {kv[1]}")
    nested = st.tuples(st.sampled_from(FIELDS), st.lists(line, min_size=1, max_size=3)).map(
        lambda kv: kv[0] + ":\n" + "\n".join("  " + x for x in kv[1]))
    items = st.tuples(st.sampled_from(FIELDS), st.lists(value, min_size=1, max_size=3)).map(
        lambda kv: kv[0] + ":\n" + "\n".join("  - " + x for x in kv[1]))
    return st.lists(st.one_of(line, nested, items), max_size=8).map("\n".join)


YAML_DOCS = st.one_of(
    _block(FLOW),
    FLOW,
    st.tuples(st.sampled_from(["", "---\n", "%YAML 1.1\n---\n", "--- !!map\n", "--- &a\n"]), _block(FLOW),
              st.sampled_from(["", "\n...\n", "\n---\nname: y\n"])).map("".join),
)
YAML_PUNCT = st.sampled_from(list(":-[]{},&*!|>'\"%@`#?\n\t ") + ["\\0", "  ", "- ", ": ", "\n  ", "---", "..."])
RAW = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(YAML_PUNCT, st.sampled_from(FIELDS), st.sampled_from(ODD_SCALARS)), max_size=60).map("".join),
)

# --- mutations of valid specs ---------------------------------------------------------------------

TOKEN = re.compile(r"\s+|[\[\]{}:,\-]|[^\s\[\]{}:,]+")
REPLACEMENTS = ODD_SCALARS + NESTING + [f"{t} x" for t in TAGS] + ["&a x", "*a", "[*a, *a]", "{k: v}", "[1, [2, [3]]]"]


def _mutate(text: str, edits: list[tuple[str, int, str]]) -> str:
    tokens = TOKEN.findall(text)
    for kind, at, payload in edits:
        if not tokens:
            break
        i = at % len(tokens)
        if kind == "delete":
            del tokens[i]
        elif kind == "duplicate":
            tokens.insert(i, tokens[i])
        elif kind == "replace":
            tokens[i] = payload
        elif kind == "tag":
            tokens.insert(i, payload.split(" ")[0] + " ")
        elif kind == "line":  # duplicate a whole line: duplicate keys, repeated sections
            lines = "".join(tokens).split("\n")
            lines.insert(at % len(lines), lines[(at * 7) % len(lines)])
            tokens = TOKEN.findall("\n".join(lines))
    return "".join(tokens)


EDITS = st.lists(
    st.tuples(st.sampled_from(["delete", "duplicate", "replace", "tag", "line"]), st.integers(0, 10_000),
              st.sampled_from(REPLACEMENTS)),
    min_size=1, max_size=6,
)


# --- the property ---------------------------------------------------------------------------------


def _numbers(value: object) -> list[int | float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [value]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, list | tuple):
        return [n for v in value for n in _numbers(v)]
    return []


def spec_or_spec_error(text: str, base_dir: Path | None = None) -> JobSpec | None:
    """The property. Any other exception propagates and fails the test with the input shown.
    `base_dir`: the job file's directory, as `spx submit` gives it (the examples use a relative workdir)."""
    try:
        spec = parse_spec(text, base_dir)
    except SpecError as e:
        assert e.problems and all(msg for _line, _field, msg in e.problems), "a SpecError must say what is wrong"
        return None
    assert isinstance(spec, JobSpec)
    for n in _numbers(spec.model_dump()):
        assert math.isfinite(n) and abs(n) <= 2**63 - 1, f"{n!r} in a returned JobSpec"
    return spec


@FUZZ
@given(YAML_DOCS)
def test_random_yaml_documents(text):
    spec_or_spec_error(text)


@FUZZ
@given(RAW)
def test_random_text(text):
    spec_or_spec_error(text)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_mutated_example_specs(example):
    original = example.read_text()
    assert spec_or_spec_error(original, example.parent) is not None, "the seed itself must be a valid job"

    @FUZZ
    @given(EDITS)
    def mutated(edits):
        spec_or_spec_error(_mutate(original, edits), example.parent)

    mutated()


def test_mutations_reach_both_outcomes():
    """The mutator is not vacuous: some mutations still parse, some are refused."""
    original = EXAMPLES[0].read_text()
    outcomes = {spec_or_spec_error(_mutate(original, [("replace", at, ".inf")]), EXAMPLES[0].parent) is None
                for at in range(0, 200, 3)}
    assert outcomes == {True, False}
