"""No import circle among the library's modules (issue 44): no module imports, even for type annotations only (under
``TYPE_CHECKING``), a module that imports it back, directly or through others. A circle hides in lazy imports and
annotations until a reorder of imports breaks the package at import time, and it says two modules are one concern."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
SRC = ROOT / "cai_mpi" / "_src"


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> set[str]:
    """The library modules ``path`` imports at module level, in functions or under TYPE_CHECKING alike."""
    name = module_of(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            stem = ".".join([*base, *([node.module] if node.module else [])])
            candidates = [stem, *(f"{stem}.{alias.name}" for alias in node.names)]
        else:
            continue
        found |= {c for c in candidates if c in known and c != name}
    return found


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` (its modules in order, the first again at the end), or None."""
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := walk(start)):
            return found
    return None


def test_the_finder_sees_an_import_under_type_checking() -> None:
    assert circle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert circle({"a": {"b"}, "b": set()}) is None


def test_the_librarys_modules_import_no_circle() -> None:
    paths = sorted(SRC.rglob("*.py"))
    known = {module_of(p) for p in paths}
    packages = {module_of(p) for p in paths if p.name == "__init__.py"}
    # (a package's __init__ re-exports its modules, and a module importing a sibling goes through it: no circle)
    graph = {module_of(p): set() if p.name == "__init__.py" else imports(p, known) - packages for p in paths}
    assert circle(graph) is None, circle(graph)
