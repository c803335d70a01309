"""No private name crosses a module boundary in the library (docs/design.md, "The layers"): a name with a leading
underscore is imported by no other module, and an attribute or method spelled ``obj._name`` is read only in a
module that defines ``_name`` itself (a subclass overriding it defines it too). What several modules share is a
documented name in its owner (``requests.wait_until``, ``array.host_memory``, ``privcomm.WORLD``...)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "cai_mpi" / "_src"
STDLIB_PRIVATE = {"_replace", "_asdict", "_fields", "_make", "_fields_"}  # namedtuple's and ctypes' own API


def _defined(tree: ast.AST) -> set[str]:
    """The private names a module defines: functions and methods, attributes it assigns, __slots__ entries."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                    if target.id == "__slots__" and node.value is not None:
                        names |= {c.value for c in ast.walk(node.value)
                                  if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return {n for n in names if n.startswith("_")}


def _read_elsewhere(tree: ast.AST) -> set[str]:
    """Private attributes read on something other than ``self``, ``cls`` or ``super()``."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                continue
            found.add(node.attr)
    return found - STDLIB_PRIVATE


def crossings(modules: dict[str, str]) -> list[str]:
    """Each private name a module imports from another, or reads without defining it: 'module: name'."""
    found = []
    for name, source in sorted(modules.items()):
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                found += [f"{name}: imports {a.name}" for a in node.names if a.name.startswith("_")]
        found += [f"{name}: reads .{attr}" for attr in sorted(_read_elsewhere(tree) - _defined(tree))]
    return found


def test_the_scan_finds_both_kinds_of_crossing() -> None:
    modules = {
        "owner.py": "class A:\n    def _wait(self):\n        self._state = 1\n",
        "user.py": "from .owner import _helper\n\ndef f(a):\n    a._wait()\n    return a._state\n",
        "subclass.py": ("class B(A):\n    def _wait(self):\n        return super()._wait()\n\n"
                        "def g(b):\n    b._wait()\n"),
    }
    assert crossings(modules) == ["user.py: imports _helper", "user.py: reads ._state", "user.py: reads ._wait"]


def test_no_private_name_crosses_a_module_boundary() -> None:
    modules = {str(path.relative_to(SRC)): path.read_text() for path in SRC.rglob("*.py")}
    assert crossings(modules) == []
