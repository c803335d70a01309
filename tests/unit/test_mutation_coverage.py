"""scripts/mutation.py's tables: every library module under cai_mpi/_src (outside cli/) is mutated by exactly one
entry, and every test file an entry runs exists (a renamed test file would otherwise be silently left out)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.one_wheel


def mutation() -> Any:
    spec = importlib.util.spec_from_file_location("mutation_script", ROOT / "scripts" / "mutation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_library_module_is_mutated_by_exactly_one_entry() -> None:
    script = mutation()
    assert script.uncovered() == []
    files: list[Path] = []
    for paths, _, _ in script.MODULES.values():
        for name in paths:
            path = ROOT / name
            files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    assert len(files) == len(set(files)), "a module is mutated by two entries (two sessions would score it twice)"


def test_every_targeted_test_file_exists() -> None:
    script = mutation()
    for module, (_, unit, mpi) in script.MODULES.items():
        for name in unit:
            assert (ROOT / name if name.startswith("tests/") else ROOT / "tests" / "unit" / name).is_file(), (module,
                                                                                                              name)
        for name in mpi:
            assert (ROOT / "tests" / "mpi" / name).is_file(), (module, name)
