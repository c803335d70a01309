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


# cuda-bindings releases whose cuPointerGetAttribute(s) report DEVICE_ORDINAL 0 for every pointer (NVIDIA/cuda-python
# #2928), and the first fixed ones; cuda-python X.Y.Z requires cuda-bindings~=X.Y.Z.
BROKEN_BINDINGS = ("12.9.6", "12.9.7", "12.9.8", "13.1.2", "13.2.0", "13.3.0", "13.3.1", "13.4.0", "13.4.1", "13.4.2")
FIXED_BINDINGS = {"cuda12": ("12.9.9", "12.9.10"), "cuda13": ("13.4.3", "13.5.0"),
                  "test": ("12.9.9", "12.9.10", "13.4.3", "13.5.0")}


@pytest.mark.parametrize("extra", ["cuda12", "cuda13", "test"])
def test_no_extra_admits_bindings_that_misplace_pointers(extra: str) -> None:
    requirements = pytest.importorskip("packaging.requirements")
    reqs = {r.name: r for r in map(requirements.Requirement, EXTRAS[extra]) if r.name.startswith("cuda-")}
    bindings = reqs["cuda-bindings"].specifier
    assert not [v for v in BROKEN_BINDINGS if bindings.contains(v)], (extra, str(bindings))
    assert all(bindings.contains(v) for v in FIXED_BINDINGS[extra]), (extra, str(bindings))
    if "cuda-python" in reqs:  # it pins cuda-bindings to its own release series: its floor must be a fixed one
        assert not [v for v in BROKEN_BINDINGS if reqs["cuda-python"].specifier.contains(v)], extra


def released_version(changelog: str) -> str:
    """The version of the top released section of a Keep a Changelog file (``## 1.2.0`` or ``## [1.2.0] - date``).

    An ``## Unreleased`` section may sit above it, and only there: it collects what the next release will hold."""
    import re

    headings = re.findall(r"^## +\[?([^\]\s]+)\]?", changelog, re.MULTILINE)
    released = [h for h in headings if h.lower() != "unreleased"]
    if not released:
        raise ValueError("CHANGELOG.md has no released section (## X.Y.Z)")
    if "unreleased" in (h.lower() for h in headings[1:]):
        raise ValueError(f"CHANGELOG.md: the Unreleased section must be the first one, not after {headings[0]}")
    return released[0]


def test_released_version_reads_the_top_released_section() -> None:
    assert released_version("# Changelog\n\n## Unreleased\n\n- x\n\n## 0.2.0\n\n## 0.1.0\n") == "0.2.0"
    assert released_version("## [1.0.0] - 2026-01-02\n\n## [0.9.0] - 2025-12-01\n") == "1.0.0"
    with pytest.raises(ValueError, match="no released section"):
        released_version("## Unreleased\n\n- x\n")
    with pytest.raises(ValueError, match="must be the first"):
        released_version("## 0.2.0\n\n## Unreleased\n\n## 0.1.0\n")


def test_the_version_is_the_top_released_section_of_the_changelog() -> None:
    """pyproject.toml's version is what was last released: new work goes under "## Unreleased" until a release
    names it (and then sets the version here too)."""
    changelog = (Path(__file__).parents[2] / "CHANGELOG.md").read_text()
    assert PYPROJECT["project"]["version"] == released_version(changelog), (
        "pyproject.toml's version must match the top released section of CHANGELOG.md"
    )


def test_the_python_classifiers_start_at_requires_python_and_leave_no_gap() -> None:
    import re

    floor = re.fullmatch(r">=\s*3\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert floor, PYPROJECT["project"]["requires-python"]
    minors = sorted(int(c.rsplit(".", 1)[1]) for c in PYPROJECT["project"]["classifiers"]
                    if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    assert minors and minors[0] == int(floor[1]), (minors, floor[0])
    assert minors == list(range(minors[0], minors[-1] + 1)), minors


def test_the_package_names_its_authors() -> None:
    assert PYPROJECT["project"]["authors"], "pyproject.toml [project] authors"


def test_the_tools_dependencies_are_the_bench_extra_not_the_librarys() -> None:
    """tqdm and matplotlib serve only `python -m cai_mpi bench` and `soak` (issue 25): the library, the demo and
    the tests that need no tools install without them (scripts/check-wheel.sh checks that wheel)."""
    requirements = pytest.importorskip("packaging.requirements")

    def names(reqs: list[str]) -> set[str]:
        return {requirements.Requirement(r).name for r in reqs}

    assert names(PYPROJECT["project"]["dependencies"]) == {"numpy", "mpi4py"}
    assert names(EXTRAS["bench"]) == {"tqdm", "matplotlib"}
    assert "plot" not in EXTRAS
    assert "bench" in requirements.Requirement(EXTRAS["dev"][0]).extras  # the suite runs the tools too
