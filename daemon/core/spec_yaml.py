"""Reading a job file's YAML into plain data, and the error every job-file problem is reported with.

The file comes from a user and the daemon is root, so the reader trusts nothing: anchors/aliases and
deep nesting are refused while the text is still a stream of events (alias bombs, and the composer's
recursion: 3,000 `[` would be a RecursionError there), and the loader builds only str, int, float,
bool, None, list and dict with text keys. Contract of `read_yaml`: returns (root node, data) or raises
SpecError naming the line; nothing else for any text up to the caller's size cap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import yaml

MAX_DEPTH = 16
# Pure-Python YAML costs ~25 us per node per pass: 64 KiB of `a,` (32k nodes) would hold the main loop
# for seconds. A real job file has a few hundred nodes.
MAX_NODES = 4000
MAX_INT = 2**63 - 1  # SQLite's integer range; larger numbers in a job file are refused when read


class SpecError(Exception):
    """A job file is unusable. `problems` are (line or None, field path, message) triples."""

    def __init__(self, problems: list[tuple[int | None, str, str]]):
        self.problems = problems
        super().__init__(self.render())

    def render(self, filename: str = "") -> str:
        lines = []
        for line, field, msg in self.problems:
            where = filename + (f":{line}" if line else "")
            prefix = f"{where}: " if where else ""
            lines.append(f"{prefix}{field + ': ' if field else ''}{msg}")
        return "\n".join(lines)


_CORE = "tag:yaml.org,2002:"
# Implicit types a job file has no use for: dates, `<<` merges and `=` read as plain text instead.
_TEXT_INSTEAD = {_CORE + "timestamp", _CORE + "merge", _CORE + "value"}
_MAX_NUMBER_CHARS = 64  # longer than any int64 or float literal; int() of 5,000 digits is a ValueError


def _line(node: yaml.Node) -> int | None:
    return node.start_mark.line + 1 if node.start_mark else None


def _show(node: yaml.Node) -> str:
    if isinstance(node, yaml.ScalarNode):
        text = repr(node.value)
        return text if len(text) <= 40 else text[:37] + "..."
    return "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"


def _short_tag(tag: str) -> str:
    tag = "!!" + tag.removeprefix(_CORE) if tag.startswith(_CORE) else tag
    return tag if len(tag) <= 60 else tag[:57] + "..."


class _SpecLoader(yaml.SafeLoader):
    """Builds plain data only: str, int, float, bool, None, list, and dict with text keys.

    Every other tag (`!!python/...`, `!custom`, `!!set`, `!!omap`, `!!binary`, `!!timestamp`) is a
    SpecError, and so is a core tag whose value does not convert (`!!int 1.5`, `!!bool maybe`), a
    non-text or repeated mapping key, and text holding NUL or lone surrogates (exec would choke on
    it later, as root). Each error names its line.
    """

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in _TEXT_INSTEAD]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    yaml_constructors: ClassVar[dict[Any, Any]] = {}


def _refuse(node: yaml.Node, message: str, field: str = "") -> SpecError:
    return SpecError([(_line(node), field, message)])


def _converted(kind: str, convert: Callable[..., Any]) -> Callable[[yaml.SafeLoader, yaml.Node], Any]:
    """pyyaml's converter for `kind`, with its ValueError/KeyError (`!!int 1.5`) turned into a SpecError."""
    def construct(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
        if isinstance(node, yaml.ScalarNode) and kind in ("int", "float") and len(node.value) > _MAX_NUMBER_CHARS:
            raise _refuse(node, f"number too large: {_show(node)}")
        try:
            value = convert(loader, node)
        except (ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError):
            raise _refuse(node, f"{_show(node)} is not a valid {kind}") from None
        if kind == "int" and abs(value) > MAX_INT:
            raise _refuse(node, f"number too large: {_show(node)}")
        return value

    return construct


def _text(loader: yaml.SafeLoader, node: yaml.Node) -> str:
    if not isinstance(node, yaml.ScalarNode):
        raise _refuse(node, f"expected text, got {_show(node)}")
    value = str(node.value)
    if "\x00" in value:
        raise _refuse(node, "text must not contain NUL characters")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise _refuse(node, "text must be valid Unicode (no lone surrogate escapes)") from None
    return value


def _sequence(loader: yaml.SafeLoader, node: yaml.Node) -> list:
    if not isinstance(node, yaml.SequenceNode):
        raise _refuse(node, f"expected a list, got {_show(node)}")
    return [loader.construct_object(child, deep=True) for child in node.value]


def _mapping(loader: yaml.SafeLoader, node: yaml.Node) -> dict:
    if not isinstance(node, yaml.MappingNode):
        raise _refuse(node, f"expected a mapping, got {_show(node)}")
    out: dict[str, Any] = {}
    lines: dict[str, int | None] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise _refuse(key_node, f"mapping keys must be text; {_show(key_node)} is not (quote it)")
        if key in out:
            raise _refuse(key_node, f"duplicate key (first given on line {lines[key]})", key)
        lines[key] = _line(key_node)
        out[key] = loader.construct_object(value_node, deep=True)
    return out


def _refused_tag(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    raise _refuse(node, f"YAML tag {_short_tag(node.tag)} is not allowed in job files "
                        "(only text, numbers, true/false, null, lists and mappings)")


for _tag, _construct in {
    "str": _text,
    "int": _converted("int", yaml.SafeLoader.construct_yaml_int),
    "float": _converted("float", yaml.SafeLoader.construct_yaml_float),
    "bool": _converted("bool (true or false)", yaml.SafeLoader.construct_yaml_bool),
    "null": _converted("null", yaml.SafeLoader.construct_yaml_null),
    "seq": _sequence,
    "map": _mapping,
}.items():
    _SpecLoader.add_constructor(_CORE + _tag, _construct)
_SpecLoader.add_constructor(None, _refused_tag)


def _yaml_error(e: yaml.YAMLError, text: str) -> SpecError:
    if isinstance(e, yaml.reader.ReaderError):  # a control character: no mark, only a position
        line = text.count("\n", 0, e.position) + 1
        code = e.character if isinstance(e.character, int) else ord(e.character)
        return SpecError([(line, "", f"invalid YAML: control character U+{code:04X} is not allowed")])
    mark = getattr(e, "problem_mark", None)
    return SpecError([(mark.line + 1 if mark else None, "", f"invalid YAML: {getattr(e, 'problem', None) or e}")])


def _scan_events(text: str) -> None:
    """Walk the event stream before composing anything: anchors/aliases are refused while they are
    still tokens (an alias bomb expands at compose time), nesting is counted here because the
    composer and constructor recurse once per level (3,000 `[` would be a RecursionError there), and
    so are nodes (MAX_NODES), which bounds the time the later passes take."""
    depth = nodes = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            line = event.start_mark.line + 1 if event.start_mark else None
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise SpecError([(line, "", "YAML anchors/aliases are not allowed in job files")])
            if isinstance(event, yaml.NodeEvent):
                nodes += 1
                if nodes > MAX_NODES:
                    raise SpecError([(line, "", f"more than {MAX_NODES} YAML values; a job file is far smaller")])
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise SpecError([(line, "", f"nesting deeper than {MAX_DEPTH} levels")])
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError as e:
        raise _yaml_error(e, text) from e


def read_yaml(text: str) -> tuple[yaml.Node, Any]:
    """(root node, plain data) of one YAML document; SpecError for anything else (see module doc)."""
    _scan_events(text)
    loader = _SpecLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            raise SpecError([(None, "", "file is empty; a job needs at least `name` and `script`")])
        return root, loader.construct_document(root)
    except yaml.YAMLError as e:
        raise _yaml_error(e, text) from e
    finally:
        loader.dispose()


def line_of(root: yaml.Node | None, loc: tuple) -> int | None:
    """Line of the deepest node along `loc` (a pydantic error location) in the composed YAML."""
    node, line = root, (root.start_mark.line + 1 if root is not None else None)
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
            key = next((k for k, _ in node.value if getattr(k, "value", None) == part), None)
            if match is None:
                break
            line = (key or match).start_mark.line + 1
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line
