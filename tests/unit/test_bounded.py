"""core.bounded, the one reader for numbers and structures in files a user writes (issue 25).

Property: for ANY bytes, `parse_json` returns plain JSON data whose every number is finite and below
2**53 in size, or raises Garbage with a reason — never OverflowError, RecursionError, TypeError or
KeyError — and the typed accessors hold the same promise for any value. Examples: each hostile
number the issue found (10**400, 1e400, 2**63, 1e300, NaN, 4,000 `[`).

Derandomized and bounded like tests/unit/test_spec_fuzz.py; a failure prints the input.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spx.daemon.core import bounded
from spx.daemon.core.bounded import Fields, Garbage, Unusable

FUZZ = settings(
    max_examples=200, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Numbers as a hostile writer spells them: past float, past int64, past 2**53, past Python's
# 4,300-digit int() limit, and JSON's non-standard constants that json.loads accepts.
HOSTILE_NUMBERS = [
    "1e400", "-1e400", "1e300", "-1e300", "NaN", "Infinity", "-Infinity", "1" + "0" * 400, "-" + "9" * 30,
    "9" * 5000, str(2**63), str(2**63 - 1), str(2**53), str(2**53 - 1), str(-(2**53)), "9007199254740993.0",
    "-0", "0", "1.5", "1E+2", "0.1e-400", "17", "00", "1.", ".5", "+1", "0x10",
]
KEYS = [
    "step", "epoch", "samples_per_second", "last_checkpoint_step", "last_checkpoint_time", "status", "time",
    "phases", "first_step", "rendezvous", "node_rank", "nnodes", "ranks", "host", "job", "expires", "written",
    "state", "reason", "gen", "label", "not_before", "final", "counted", "attempt_id", "launched", "exit_code",
    "signal", "stop_signal", "end", "ok", "result", "", "\u0000", "\ud800", "ü",
]
NESTING = ["[" * 4000, "[" * 4000 + "]" * 4000, "{\"a\":" * 3000 + "1" + "}" * 3000, "[" * 33 + "]" * 33,
           "[" * 32 + "]" * 32, '"' + "[" * 5000 + '"', "[" * 40 + '"\\"' * 50]


def _json_text(value: object) -> str:
    return json.dumps(value)


SCALAR_TEXT = st.one_of(
    st.sampled_from(HOSTILE_NUMBERS),
    st.integers().map(str),
    st.floats().map(_json_text),  # NaN, Infinity, 1e308 …
    st.text(max_size=12).map(_json_text),
    st.sampled_from(["true", "false", "null", '"running"', '"succeeded"', '"\\ud800"', '"\\u0000"']),
)


def _containers(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    array = st.lists(children, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]")
    key = st.one_of(st.sampled_from(KEYS), st.text(max_size=6)).map(_json_text)
    obj = st.lists(st.tuples(key, children), max_size=6).map(lambda kvs: "{" + ",".join(f"{k}:{v}" for k, v in kvs) + "}")
    return st.one_of(array, obj)


JSONISH = st.recursive(SCALAR_TEXT, _containers, max_leaves=24)
# Whole documents: JSON-ish text, nesting bombs, raw bytes, and JSON-ish text with bytes spliced in.
DOCUMENTS = st.one_of(
    JSONISH.map(str.encode),
    st.sampled_from(NESTING).map(str.encode),
    st.binary(max_size=200),
    st.tuples(JSONISH, st.binary(max_size=8), st.integers(0, 10_000)).map(
        lambda t: t[0].encode()[: t[2] % (len(t[0]) + 1)] + t[1] + t[0].encode()[t[2] % (len(t[0]) + 1):]),
)


def bounded_numbers_only(value: object) -> None:
    """Every number in `value` is one the daemon computes with."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, int | float):
        assert math.isfinite(value) and abs(value) < bounded.LIMIT, value
        return
    if isinstance(value, dict):
        for k, v in value.items():
            assert isinstance(k, str)
            bounded_numbers_only(v)
        return
    assert isinstance(value, list), f"{type(value).__name__} in parsed JSON"
    for v in value:
        bounded_numbers_only(v)


def data_or_garbage(raw: bytes, mark: bool = False) -> object:
    """The property. Any other exception propagates and fails the test with the input shown."""
    try:
        doc = bounded.parse_json(raw, "record", mark=mark)
    except Garbage as e:
        assert e.what == "record" and e.detail and str(e).startswith("record: ")
        return None
    if not mark:
        bounded_numbers_only(doc)
    return doc


@FUZZ
@given(DOCUMENTS)
def test_parse_json_gives_bounded_data_or_garbage(raw):
    data_or_garbage(raw)


@FUZZ
@given(DOCUMENTS)
def test_marked_parse_and_every_accessor_give_a_value_in_range_or_garbage(raw):
    doc = data_or_garbage(raw, mark=True)
    try:
        f = Fields(doc, "record")
    except Garbage:
        return
    for key in KEYS:
        for read, check in (
            (lambda k: f.whole(k, 0, bounded.MAX_WHOLE, missing=None), lambda v: 0 <= v <= bounded.MAX_WHOLE),
            (lambda k: f.real(k, 0.0, bounded.MAX_TIME, missing=None), lambda v: math.isfinite(v) and 0 <= v <= 1e11),
            (lambda k: f.text(k, 64, missing=None), lambda v: isinstance(v, str) and len(v) <= 64),
            (lambda k: f.items(k, 4, missing=None), lambda v: isinstance(v, list) and len(v) <= 4),
            (lambda k: f.mapping(k, missing=None), lambda v: isinstance(v, Fields)),
        ):
            try:
                value = read(key)
            except Garbage as e:
                assert e.detail.startswith(key) and e.what == "record"
                continue
            assert value is None or check(value), (key, value)


def test_the_parsers_reach_both_outcomes():
    """The generator is not vacuous: some documents parse, some are garbage."""
    outcomes = {data_or_garbage(raw) is None for raw in (b'{"step": 3}', b"[" * 4000, b'{"a": 1e400}')}
    assert outcomes == {True, False}


# --- the cases issue 25 found -------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "reason"), [
    (b'{"step": 1' + b"0" * 400 + b"}", "step 1" + "0" * 35 + "… (401 digits) is not a number"),
    (b'{"step": 1e400}', "step 1e400 is not a number"),
    (b'{"phases": {"first_step": 1e400}}', "phases.first_step 1e400 is not a number"),
    (b'{"step": 9223372036854775808}', "step 9223372036854775808 is not a number"),
    (b'{"expires": 1e300}', "expires 1e300 is not a number"),
    (b'{"t": NaN}', "t NaN is not a number"),
    (b'{"t": [1, -Infinity]}', "t[1] -Infinity is not a number"),
    (b"[" * 4000, "nested deeper than 32 levels"),
    (b'{"a": "' + b"9" * 5000 + b'"}' + b" " * 70_000, "larger than 65536 bytes"),
    (b"\xff{}", "not UTF-8 text (byte 0)"),
    (b"", "not JSON (Expecting value at line 1 column 1)"),
])
def test_a_hostile_document_is_garbage_with_a_reason(raw, reason):
    with pytest.raises(Garbage) as e:
        bounded.parse_json(raw, "heartbeat")
    assert str(e.value).startswith(f"heartbeat: {reason}"), str(e.value)


def test_brackets_inside_strings_do_not_count_as_nesting():
    deep_text = {"reason": "[" * 5000 + "{" * 5000, "q": '\\"[[['}
    assert bounded.parse_json(json.dumps(deep_text).encode(), "state") == deep_text
    assert bounded.parse_json("[" * 32 + "]" * 32, "x") is not None, "32 levels are allowed"
    with pytest.raises(Garbage, match="deeper than 32"):
        bounded.parse_json("[" * 33 + "]" * 33, "x")


def test_the_largest_numbers_kept_and_the_smallest_refused():
    assert bounded.parse_json(f"[{2**53 - 1}, {-(2**53 - 1)}, 9007199254740991.0, 1e-400]", "x") == [
        2**53 - 1, -(2**53 - 1), 9007199254740991.0, 0.0]
    for refused in (str(2**53), str(-(2**53)), "9007199254740992.0", "1e16"):
        with pytest.raises(Garbage):
            bounded.parse_json(f"[{refused}]", "x")


def test_a_marked_parse_keeps_the_document_and_the_numbers_as_written():
    doc = bounded.parse_json(b'{"step": 3, "phases": {"first_step": 1e400, "rendezvous": NaN}}', "heartbeat", mark=True)
    assert doc == {"step": 3, "phases": {"first_step": Unusable("1e400"), "rendezvous": Unusable("NaN")}}
    f = Fields(doc, "heartbeat")
    assert f.whole("step") == 3
    with pytest.raises(Garbage, match=r"^heartbeat: phases\.first_step 1e400 is not a number in \[0, 1e\+11\]$"):
        f.mapping("phases").real("first_step", 0.0, bounded.MAX_TIME)


@pytest.mark.parametrize(("value", "shown"), [
    (10**400, "a 1329-bit integer"), (2**63, "9223372036854775808"), (-1, "-1"), (True, "true"), (None, "null"),
    ("7", "'7'"), (1.5, "1.5"), ([], "a list"), ({}, "an object"), (Unusable("1e400"), "1e400"),
])
def test_a_whole_field_refuses_what_is_no_whole_number_in_range(value, shown):
    with pytest.raises(Garbage) as e:
        Fields({"step": value}, "heartbeat").whole("step")
    assert str(e.value) == f"heartbeat: step {shown} is not a whole number in [0, 2**53 - 1]"


def test_optional_and_missing_fields():
    f = Fields({"a": None, "b": 2}, "lease")
    assert f.whole("a", missing=7) == 7 and f.whole("zz", missing=None) is None and f.whole("b") == 2
    with pytest.raises(Garbage, match="^lease: zz is missing$"):
        f.whole("zz")
    with pytest.raises(Garbage, match="^lease: a null is not a whole number"):
        f.whole("a")
    with pytest.raises(Garbage, match=r"^lease: a list is not a JSON object$"):
        Fields([], "lease")


def test_a_real_field_compares_before_it_converts():
    """float(10**400) is an OverflowError: the range check comes first, for any int."""
    for value in (10**400, -(10**400), float("inf"), float("nan"), 1e300):
        with pytest.raises(Garbage):
            bounded.real(value, "lease", 0.0, bounded.MAX_TIME, "expires")
    assert bounded.real(17, "lease", 0.0, bounded.MAX_TIME, "expires") == 17.0


def test_text_and_list_fields_have_caps():
    assert bounded.text("running", "heartbeat", 64) == "running"
    for bad in ("x" * 65, "a\x00b", "\ud800", 5, None):
        with pytest.raises(Garbage):
            bounded.text(bad, "heartbeat", 64, "status")
    assert bounded.items([1, 2], "heartbeat", 2) == [1, 2]
    with pytest.raises(Garbage, match="a list of 3 is not a list of at most 2"):
        bounded.items([1, 2, 3], "heartbeat", 2, "ranks")


@pytest.mark.parametrize(("raw", "value"), [(b"17\n", 17), (b" 3 ", 3), (b"9007199254740991", 2**53 - 1)])
def test_a_number_written_as_text(raw, value):
    assert bounded.whole_text(raw, ".job-id") == value


@pytest.mark.parametrize("raw", [b"", b"-1", b"1.0", b"9" * 19, b"9" * 5000, b"\xff", b"1 2", "\u0663".encode(), b"0x1"])
def test_a_number_written_as_text_refuses_anything_else(raw):
    with pytest.raises(Garbage, match=r"^\.job-id: "):
        bounded.whole_text(raw, ".job-id")


@FUZZ
@given(st.binary(max_size=40))
def test_a_number_written_as_text_is_in_range_or_garbage(raw):
    try:
        assert 0 <= bounded.whole_text(raw, ".job-id") <= bounded.MAX_WHOLE
    except Garbage:
        pass
