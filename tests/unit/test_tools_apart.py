"""The test doubles and the tools stay outside the library's import graph (issue 25): nothing under cai_mpi/_src but
the command line layer (cai_mpi/_src/cli) imports cai_mpi.testing, by statement or by name; the runtime is chosen
by the library itself (or installed with set_runtime), and the test hooks are not among the user settings."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cai_mpi._src.config import ENV_VARS, TEST_HOOKS, Config
from cai_mpi._src.runtime import get_runtime, set_runtime

ROOT = Path(__file__).parents[2]
SRC = ROOT / "cai_mpi" / "_src"
CLI = SRC / "cli"


def names_of_testing(module: str, text: str) -> list[int]:
    """The lines where ``module`` (dotted, e.g. cai_mpi._src.runtime.cuda) imports cai_mpi.testing, or names it in
    a string (importlib.import_module, __import__)."""
    package = module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            targets = [".".join([*base, node.module or "", alias.name]).replace("..", ".") for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            targets = re.findall(r"\bcai_mpi\.testing\b", node.value)
        else:
            continue
        found += [node.lineno for t in targets if re.match(r"cai_mpi\.testing\b", t)]
    return sorted(found)


def test_the_scanner_finds_every_way_of_naming_the_test_package() -> None:
    code = ("from ...testing import SimulatedRuntime\nimport cai_mpi.testing\n"
            "importlib.import_module('cai_mpi.testing')\nfrom cai_mpi import config\nfrom ..testing import x\n"
            "from . import testing\n")
    assert names_of_testing("cai_mpi._src.runtime.probe", code) == [1, 2, 3]
    assert names_of_testing("cai_mpi._src.probe", code) == [2, 3, 5]


def test_nothing_below_the_cli_layer_imports_the_test_package() -> None:
    offenders = [f"{path.relative_to(ROOT)}:{line}" for path in sorted(SRC.rglob("*.py")) if CLI not in path.parents
                 for line in names_of_testing(".".join(path.relative_to(ROOT).with_suffix("").parts),
                                              path.read_text())]
    assert not offenders, f"cai_mpi.testing imported or named outside cai_mpi/_src/cli: {offenders}"


def test_importing_the_library_and_choosing_a_runtime_loads_no_test_double() -> None:
    code = ("import sys, cai_mpi\nfrom cai_mpi._src.runtime import get_runtime\nget_runtime()\n"
            "print(sorted(m for m in sys.modules if m.startswith('cai_mpi.testing') or m.startswith('tqdm')))")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("CAI_MPI_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_simulated_gpu_is_not_a_runtime_name() -> None:
    """Only an instance installs it: ``set_runtime(SimulatedRuntime())`` (cai_mpi.testing.use_runtime)."""
    with pytest.raises(ValueError, match=r"'simulated'.*expected 'cuda', 'host'"):
        set_runtime("simulated")
    assert get_runtime().name == "host"  # (the conftest's runtime, untouched)


@pytest.mark.parametrize("raw", ["simulated", "SIMULATED"])
def test_cai_mpi_runtime_does_not_take_the_simulated_gpu(raw: str) -> None:
    with pytest.raises(ValueError, match=r"expected cuda or host .*python -m cai_mpi run --simulated-gpu"):
        Config.from_env({"CAI_MPI_RUNTIME": raw})


def test_test_hooks_are_apart_from_the_user_settings() -> None:
    assert set(TEST_HOOKS) == {"CAI_MPI_TEST_CUDA_DRIVER"}
    assert not set(TEST_HOOKS) & set(ENV_VARS)
    assert "simulated" not in ENV_VARS["CAI_MPI_RUNTIME"]
    user_table = (ROOT / "docs" / "environment.md").read_text()
    testing_page = (ROOT / "docs" / "testing.md").read_text()
    for name in ENV_VARS:
        assert f"| `{name}` |" in user_table, name
    for name in TEST_HOOKS:
        assert name not in user_table, name
        assert f"`{name}" in testing_page, name
    assert "CAI_MPI_CUDA_DRIVER" not in user_table and "`simulated`" not in user_table  # not a runtime value


def test_the_source_reads_no_cai_mpi_variable_that_neither_table_names() -> None:
    read = set()
    for path in SRC.rglob("*.py"):
        read |= set(re.findall(r"[\"'](CAI_MPI_[A-Z0-9_]+)[\"']", path.read_text()))
    assert read - set(ENV_VARS) - set(TEST_HOOKS) == set()
