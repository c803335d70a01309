"""What the package promises to install: the CUDA extras bring CuPy with its CUDA toolkit wheels ([ctk]), so
the pack/unpack kernels compile (NVRTC) on GPU nodes that have only a driver."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")
PYPROJECT = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]


@pytest.mark.parametrize(("extra", "cupy"), [("cuda12", "cupy-cuda12x[ctk]"), ("cuda13", "cupy-cuda13x[ctk]")])
def test_cuda_extras_install_cupy_with_its_toolkit(extra: str, cupy: str) -> None:
    assert any(req.startswith(cupy) for req in EXTRAS[extra]), EXTRAS[extra]
    assert any(req.startswith("cuda-python") for req in EXTRAS[extra]), EXTRAS[extra]


def test_the_test_extra_checks_the_driver_double_against_cuda_bindings() -> None:
    assert any(req.startswith("cuda-bindings") for req in EXTRAS["test"]), EXTRAS["test"]


def test_the_version_has_one_source_pyproject() -> None:
    import importlib.metadata
    import re
    from pathlib import Path

    import cai_mpi

    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    declared = re.search(r'^version = "([^"]+)"$', pyproject, re.MULTILINE).group(1)  # (tomllib is 3.11+)
    assert cai_mpi.__version__ == importlib.metadata.version("cai_mpi") == declared


def test_a_source_tree_without_package_metadata_still_imports() -> None:
    """A checkout on PYTHONPATH (common on clusters) has no metadata for cai_mpi: the version says so, and the
    import does not fail over it."""
    import subprocess
    import sys

    hide_metadata = (
        "import importlib.metadata as md\n"
        "def version(name):\n"
        "    raise md.PackageNotFoundError(name)\n"
        "md.version = version\n"
        "import cai_mpi\n"
        "print(cai_mpi.__version__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", hide_metadata], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout.strip()) == (0, "0+unknown"), proc.stderr
