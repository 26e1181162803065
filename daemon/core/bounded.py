"""The one reader for numbers and structures in files a job's user writes.

The daemon is root and reads records its users can write: heartbeats, `.spx/lease` and `.spx/state`,
`.spx-gang/`, the answers of helpers that read them. Python's own readers trust too much for that:
`json.loads` recurses once per level (4,000 `[` is a RecursionError), a 400-digit integer is a valid
int that `float()`, `math.isfinite` and SQLite refuse later (OverflowError, far from the read),
`1e400` is `inf`, and `NaN` compares false with everything. Here:

    parse_json(data, what, max_bytes=…, max_depth=…, mark=False)
        plain JSON data whose every number is finite and below 2**53 in size; the nesting depth is
        counted by a scan that skips strings before `json.loads` may recurse
    Fields(doc, what): .whole(key, lo, hi) · .real(key, lo, hi) · .text(key, max_chars)
        · .items(key, max_items) · .mapping(key) — each with `missing=` for an optional field
    whole(value, …) · real(value, …) · text(value, …): the same checks on a value at hand
    whole_text(raw, what, lo, hi): a number written as text ("17\\n")

Whatever is not the record expected raises `Garbage`, whose message is the reason a person reads
("heartbeat: step 1e400 is not a whole number in [0, 2**53 - 1]"); no OverflowError,
RecursionError, TypeError or KeyError gets past a reader built on these. Stdlib only (`contract`,
which `spx.trainer` shares, uses it too).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, TypeVar, overload

LIMIT = 2**53                 # every integer below it is exact as a float: step counts, sizes, ids
MAX_WHOLE = LIMIT - 1
MAX_TIME = 1e11               # Unix seconds up to year 5138: time.gmtime and datetime take it
DEFAULT_MAX_BYTES = 64 * 1024
DEFAULT_MAX_DEPTH = 32        # a record is 2-4 levels deep; json.loads recurses once per level
_MAX_DIGITS = len(str(LIMIT))  # int() of 5,000 digits is a ValueError, of 4,000 a slow bignum
_SHOWN_CHARS = 40

# A JSON string (closed, or running to the end of a text that is then no JSON) or a bracket. The
# string's loop is possessive and always matches, so the scan is linear even for `"\"\"\"…`.
_TOKENS = re.compile(r'"(?:[^"\\]|\\[\s\S])*+(?:"|\\?\Z)|[\[\]{}]')

T = TypeVar("T")


class Garbage(ValueError):
    """A file a user writes is not the record it should be. `what` names the record ("heartbeat",
    ".spx/lease"), `detail` says what is wrong with it; str() is both, for a person to read."""

    def __init__(self, what: str, detail: str) -> None:
        self.what = what
        self.detail = detail
        super().__init__(f"{what}: {detail}")


@dataclass(frozen=True)
class Unusable:
    """A number `parse_json(mark=True)` did not build (too large, not finite, NaN), as written
    (at most the document's size). Only a reader that drops optional parts one by one sees it;
    `Fields` refuses it by name."""

    text: str


def _shown(value: object) -> str:
    """A value as a reason quotes it: short, one line."""
    if isinstance(value, Unusable):
        text = value.text
    elif value is None:
        return "null"
    elif isinstance(value, bool):
        return "true" if value else "false"
    elif isinstance(value, dict):
        return "an object"
    elif isinstance(value, list):
        return "a list"
    elif isinstance(value, str):
        text = repr(value)
    elif isinstance(value, int) and abs(value) >= 10**_SHOWN_CHARS:
        return f"a {value.bit_length()}-bit integer"  # str() of over 4,300 digits is a ValueError
    else:
        text = repr(value)
    if len(text) > _SHOWN_CHARS:
        digits = sum(c.isdigit() for c in text)
        text = text[:_SHOWN_CHARS - 4] + "…" + (f" ({digits} digits)" if digits > _SHOWN_CHARS // 2 else "")
    return text


def _bound(x: float) -> str:
    return "2**53 - 1" if x == MAX_WHOLE else "-(2**53 - 1)" if x == -MAX_WHOLE else f"{x:g}"


# --- parsing ---------------------------------------------------------------------------------------


class _Numbers:
    """json.loads' hooks: a number beyond the bounds becomes an Unusable (counted), never an int of
    400 digits or an inf."""

    def __init__(self) -> None:
        self.unusable = 0

    def _bad(self, text: str) -> Unusable:
        self.unusable += 1
        return Unusable(text)

    def whole(self, text: str) -> int | Unusable:
        if len(text.lstrip("-")) > _MAX_DIGITS:
            return self._bad(text)
        value = int(text)
        return value if abs(value) < LIMIT else self._bad(text)

    def real(self, text: str) -> float | Unusable:
        value = float(text)
        return value if math.isfinite(value) and abs(value) < LIMIT else self._bad(text)

    def constant(self, text: str) -> Unusable:  # NaN, Infinity, -Infinity
        return self._bad(text)


def _too_deep(text: str, max_depth: int) -> bool:
    """Does `text` nest arrays/objects deeper than `max_depth`? Brackets inside strings do not count."""
    if text.count("[") + text.count("{") <= max_depth:
        return False
    depth = 0
    for m in _TOKENS.finditer(text):
        token = m.group()
        if token == "[" or token == "{":
            depth += 1
            if depth > max_depth:
                return True
        elif token == "]" or token == "}":
            depth -= 1
    return False


def _first_unusable(doc: object, path: str) -> tuple[str, Unusable] | None:
    if isinstance(doc, Unusable):
        return path, doc
    if isinstance(doc, dict):
        children: list[tuple[str, object]] = [(f"{path}.{k}" if path else str(k), v) for k, v in doc.items()]
    elif isinstance(doc, list):
        children = [(f"{path}[{i}]", v) for i, v in enumerate(doc)]
    else:
        return None
    for where, child in children:
        found = _first_unusable(child, where)
        if found is not None:
            return found
    return None


def parse_json(data: bytes | str, what: str, *, max_bytes: int = DEFAULT_MAX_BYTES,
               max_depth: int = DEFAULT_MAX_DEPTH, mark: bool = False) -> Any:
    """The JSON document in `data` (UTF-8 bytes, or text counted in characters), at most `max_bytes`
    long and `max_depth` levels deep, every number finite and below 2**53 in size. Garbage naming
    `what` otherwise — with `mark`, a number beyond that is an `Unusable` in its place instead, for
    a reader that drops bad optional parts (it must read every field through `Fields`)."""
    if len(data) > max_bytes:
        raise Garbage(what, f"larger than {max_bytes} bytes")
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise Garbage(what, f"not UTF-8 text (byte {e.start})") from None
    else:
        text = data
    if _too_deep(text, max_depth):
        raise Garbage(what, f"nested deeper than {max_depth} levels")
    numbers = _Numbers()
    try:
        doc = json.loads(text, parse_int=numbers.whole, parse_float=numbers.real, parse_constant=numbers.constant)
    except json.JSONDecodeError as e:
        raise Garbage(what, f"not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except (ValueError, RecursionError) as e:  # the depth scan makes these unreachable; never let them out
        raise Garbage(what, f"not JSON ({type(e).__name__})") from None
    if numbers.unusable and not mark:
        found = _first_unusable(doc, "")
        if found is not None:
            where, bad = found
            raise Garbage(what, f"{where[:80] + ' ' if where else ''}{_shown(bad)} is not a number this daemon computes "
                                "with (finite, below 2**53 in size)")
    return doc


# --- values ------------------------------------------------------------------------------------------


def _named(name: str, value: object) -> str:
    return f"{name} {_shown(value)}" if name else _shown(value)


def whole(value: object, what: str, lo: int = 0, hi: int = MAX_WHOLE, name: str = "") -> int:
    """`value` if it is an int (not a bool) in [lo, hi]; Garbage(what, "NAME VALUE is not …")."""
    if isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi:
        return value
    raise Garbage(what, f"{_named(name, value)} is not a whole number in [{lo}, {_bound(hi)}]")


def real(value: object, what: str, lo: float = -MAX_WHOLE, hi: float = MAX_WHOLE, name: str = "") -> float:
    """`value` as a float if it is a finite int or float (not a bool) in [lo, hi]. The range is
    checked before any conversion, so an int of any size is refused, never an OverflowError."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= value <= hi:
        number = float(value)
        if math.isfinite(number):
            return number
    raise Garbage(what, f"{_named(name, value)} is not a number in [{_bound(lo)}, {_bound(hi)}]")


def text(value: object, what: str, max_chars: int, name: str = "") -> str:
    """`value` if it is a string of at most `max_chars` characters, without NUL or lone surrogates
    (what a log line, a path or exec would choke on later)."""
    if isinstance(value, str) and len(value) <= max_chars and "\x00" not in value:
        try:
            value.encode()
            return value
        except UnicodeEncodeError:
            pass
    what_it_is = f"{len(value)} characters" if isinstance(value, str) and len(value) > max_chars else _shown(value)
    raise Garbage(what, f"{name + ' ' if name else ''}{what_it_is} is not a text of at most {max_chars} characters")


def items(value: object, what: str, max_items: int, name: str = "") -> list[Any]:
    """`value` if it is a list of at most `max_items` elements (check each with the functions here)."""
    if isinstance(value, list) and len(value) <= max_items:
        return value
    shown = f"a list of {len(value)}" if isinstance(value, list) else _shown(value)
    raise Garbage(what, f"{name + ' ' if name else ''}{shown} is not a list of at most {max_items}")


def whole_text(raw: bytes, what: str, lo: int = 0, hi: int = MAX_WHOLE) -> int:
    """A whole number written as ASCII digits (spaces and a newline around it allowed), in [lo, hi]."""
    digits = raw.strip(b" \t\r\n")
    if not digits.isdigit() or len(digits) > _MAX_DIGITS:
        raise Garbage(what, f"{_shown(digits.decode('ascii', 'replace'))} is not a whole number in [{lo}, {_bound(hi)}]")
    return whole(int(digits), what, lo, hi)


# --- records -----------------------------------------------------------------------------------------

_REQUIRED: Any = object()


class Fields:
    """Typed reads of one JSON object from a user's file. Each accessor returns a value in range or
    raises Garbage naming the record and the field; `missing=` makes the field optional (absent or
    null gives that value). Keys not asked for are ignored (a newer writer may add some)."""

    def __init__(self, doc: object, what: str, prefix: str = "") -> None:
        if not isinstance(doc, dict):
            raise Garbage(what, f"{prefix.rstrip('.') + ' ' if prefix else ''}{_shown(doc)} is not a JSON object")
        self.doc: dict[str, Any] = doc
        self.what = what
        self.prefix = prefix  # how a reason names this object's fields: "phases." for `mapping("phases")`

    def _get(self, key: str, missing: Any) -> tuple[bool, Any]:
        """(given, value): given False means `missing` is the answer."""
        value = self.doc.get(key)
        if value is None and missing is not _REQUIRED:
            return False, missing
        if key not in self.doc:
            raise Garbage(self.what, f"{self.prefix}{key} is missing")
        return True, value

    @overload
    def whole(self, key: str, lo: int = ..., hi: int = ...) -> int: ...
    @overload
    def whole(self, key: str, lo: int = ..., hi: int = ..., *, missing: T) -> int | T: ...

    def whole(self, key: str, lo: int = 0, hi: int = MAX_WHOLE, *, missing: Any = _REQUIRED) -> Any:
        given, value = self._get(key, missing)
        return whole(value, self.what, lo, hi, self.prefix + key) if given else value

    @overload
    def real(self, key: str, lo: float = ..., hi: float = ...) -> float: ...
    @overload
    def real(self, key: str, lo: float = ..., hi: float = ..., *, missing: T) -> float | T: ...

    def real(self, key: str, lo: float = -MAX_WHOLE, hi: float = MAX_WHOLE, *, missing: Any = _REQUIRED) -> Any:
        given, value = self._get(key, missing)
        return real(value, self.what, lo, hi, self.prefix + key) if given else value

    @overload
    def text(self, key: str, max_chars: int) -> str: ...
    @overload
    def text(self, key: str, max_chars: int, *, missing: T) -> str | T: ...

    def text(self, key: str, max_chars: int, *, missing: Any = _REQUIRED) -> Any:
        given, value = self._get(key, missing)
        return text(value, self.what, max_chars, self.prefix + key) if given else value

    @overload
    def items(self, key: str, max_items: int) -> list[Any]: ...
    @overload
    def items(self, key: str, max_items: int, *, missing: T) -> list[Any] | T: ...

    def items(self, key: str, max_items: int, *, missing: Any = _REQUIRED) -> Any:
        given, value = self._get(key, missing)
        return items(value, self.what, max_items, self.prefix + key) if given else value

    @overload
    def mapping(self, key: str) -> Fields: ...
    @overload
    def mapping(self, key: str, *, missing: T) -> Fields | T: ...

    def mapping(self, key: str, *, missing: Any = _REQUIRED) -> Any:
        """The JSON object at `key`, as Fields of its own (its reasons name "key.field")."""
        given, value = self._get(key, missing)
        return Fields(value, self.what, f"{self.prefix}{key}.") if given else value
