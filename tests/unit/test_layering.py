"""The code is its diagram: the package graph of `spx.daemon` is exactly the one drawn in
docs/architecture.md, it has no cycle, and every module is named in its package's map.

An AST scan of every module under daemon/ (imports inside functions included, as they are edges
too): each import of another `spx.daemon` package must be an edge of the drawing, and each edge of
the drawing must be used by some import, so the picture can neither miss an edge nor show one that
is gone. Each package's `__init__` docstring is its map: a module it does not name is one a newcomer
cannot find.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DAEMON = REPO / "daemon"
ARCHITECTURE = REPO / "docs" / "architecture.md"
DRAWING = re.compile(r"<!-- package-graph:.*?-->\n```\n(.*?)```", re.S)


def packages() -> list[str]:
    return sorted(p.name for p in DAEMON.iterdir() if (p / "__init__.py").exists())


def drawn_edges() -> dict[str, set[str]]:
    """`package → a, b, c` lines of the drawing in docs/architecture.md (`—`: imports none)."""
    match = DRAWING.search(ARCHITECTURE.read_text())
    assert match, "docs/architecture.md has no package-graph drawing"
    edges: dict[str, set[str]] = {}
    for line in match.group(1).splitlines():
        if "→" not in line:
            continue
        left, right = (part.strip() for part in line.split("→", 1))
        edges[left] = set() if right in ("—", "") else {name.strip() for name in right.split(",")}
    return edges


def imported_modules(path: Path) -> set[str]:
    """Every `spx.daemon.…` module (or package) this file imports, as a dotted name under spx.daemon."""
    rel = path.relative_to(DAEMON)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(rel.parent.parts)[: len(rel.parent.parts) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            elif node.module and (node.module == "spx.daemon" or node.module.startswith("spx.daemon.")):
                module = node.module.removeprefix("spx.daemon").lstrip(".")
            else:
                continue
            found.update(f"{module}.{alias.name}".lstrip(".") for alias in node.names)
            if module:
                found.add(module)
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("spx.daemon.") for a in node.names if a.name.startswith("spx.daemon."))
    return found


def actual_edges() -> dict[str, dict[str, list[str]]]:
    """package → {imported package: [importing modules]}."""
    names = set(packages())
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(DAEMON.rglob("*.py")):
        rel = path.relative_to(DAEMON)
        if len(rel.parts) < 2:
            continue
        for module in imported_modules(path):
            target = module.split(".")[0]
            if target in names and target != rel.parts[0]:
                edges[rel.parts[0]][target].append(str(rel))
    return edges


def test_every_package_is_drawn():
    assert sorted(drawn_edges()) == packages()


def test_every_import_between_packages_is_an_edge_of_the_drawing():
    drawn = drawn_edges()
    stray = [f"{src} → {dst} (in {', '.join(sorted(set(mods)))})"
             for src, targets in actual_edges().items() for dst, mods in targets.items() if dst not in drawn.get(src, set())]
    assert not stray, "imports the drawing in docs/architecture.md does not allow:\n" + "\n".join(stray)


def test_every_edge_of_the_drawing_is_used():
    actual = actual_edges()
    unused = [f"{src} → {dst}" for src, targets in drawn_edges().items() for dst in targets if dst not in actual.get(src, {})]
    assert not unused, "edges drawn in docs/architecture.md that no import makes:\n" + "\n".join(unused)


def test_the_package_graph_has_no_cycle():
    edges = {src: set(targets) for src, targets in actual_edges().items()}
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, "cycle: " + " → ".join((*path[path.index(node):], node))
        if node in done:
            return
        for nxt in sorted(edges.get(node, ())):
            visit(nxt, (*path, node))
        done.add(node)

    for package in packages():
        visit(package, ())


def test_every_module_is_named_in_its_package_map():
    """The map is the docstring's indented block (the lines a reader scans first), so a module
    named only in passing in the prose does not count."""
    missing = []
    for package in packages():
        doc = ast.get_docstring(ast.parse((DAEMON / package / "__init__.py").read_text()), clean=False) or ""
        block = "\n".join(line for line in doc.splitlines() if line.startswith("    "))
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", block))
        missing += [f"{package}/{p.name}" for p in sorted((DAEMON / package).glob("*.py"))
                    if p.stem != "__init__" and p.stem not in words]
    assert not missing, "modules missing from their package's map (its __init__ docstring):\n" + "\n".join(missing)
