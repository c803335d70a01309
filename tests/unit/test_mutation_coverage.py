"""scripts/mutation.py: every library module under cai_mpi/_src (outside cli/) is mutated by exactly one session, and
a session runs the tests that cover it: every test file that executes one of its files, measured by coverage (in the
test's own process, in the ranks it starts under mpiexec and in its subprocesses), not a hand-kept list."""

from __future__ import annotations

import importlib.util
import sys
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
    for paths in script.MODULES.values():
        for name in paths:
            path = ROOT / name
            files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    assert len(files) == len(set(files)), "a module is mutated by two entries (two sessions would score it twice)"


def test_the_map_is_made_again_when_the_library_changes_and_only_then(tmp_path: Path) -> None:
    """The map's line numbers are one revision's: a change to a library module makes it stale, one to the command
    line (no session's) or to a test does not."""
    script = mutation()
    for name in ("cai_mpi/_src/a.py", "cai_mpi/_src/cli/b.py", "tests/unit/test_a.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("X = 1\n")
    before = script.library_digest(tmp_path)
    (tmp_path / "cai_mpi/_src/cli/b.py").write_text("X = 2\n")
    (tmp_path / "tests/unit/test_a.py").write_text("X = 2\n")
    assert script.library_digest(tmp_path) == before
    (tmp_path / "cai_mpi/_src/a.py").write_text("X = 2\n")
    assert script.library_digest(tmp_path) != before


def test_a_mutant_runs_the_test_files_that_execute_its_line(tmp_path: Path) -> None:
    script = mutation()
    post, config = "cai_mpi/_src/transport/post.py", "cai_mpi/_src/config.py"
    # lines 1-5 of each file are its import (every test that runs the file runs them); the rest is its use
    coverage_map = {"tests": {
        "tests/unit/test_a.py": {"files": {config: "1-5,10-20", post: "1-5"}, "seconds": 1.0},
        "tests/test_b.py": {"files": {post: "1-5,8-10,40", config: "1-5,15"}, "seconds": 9.0},
        "tests/mpi/test_c.py": {"files": {post: "1-5,8-50", config: "1-5"}, "seconds": 2.0},
        "tests/mpi/test_gone.py": {"files": {post: "1-50"}, "seconds": 0.1},
        "tests/unit/test_imports_only.py": {"files": {post: "1-5", config: "1-5"}, "seconds": 0.5},
        # fails on the library as it is (a check of something the mutation venv's wheel does differently): it
        # would count every mutant it runs for as killed
        "tests/test_fails_already.py": {"files": {post: "1-5,8-50", config: "1-20"}, "seconds": 0.2,
                                        "status": "exit 1"},
    }}
    for name in coverage_map["tests"]:
        if name != "tests/mpi/test_gone.py":
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text("")
    # a session runs the tests that use its files beyond importing them, the quickest first (the transport session
    # mutates a folder: a file inside it is its); a test file gone since the map was made is left out
    assert script.chosen_tests("transport", coverage_map, tmp_path) == ["tests/mpi/test_c.py", "tests/test_b.py"]
    assert script.chosen_tests("config", coverage_map, tmp_path) == ["tests/unit/test_a.py", "tests/test_b.py"]
    assert script.chosen_tests("pipeline", coverage_map, tmp_path) == []
    # a mutant runs the tests that execute its line
    assert script.chosen_tests("transport", coverage_map, tmp_path, (post, 40)) == ["tests/mpi/test_c.py",
                                                                                    "tests/test_b.py"]
    assert script.chosen_tests("transport", coverage_map, tmp_path, (post, 30)) == ["tests/mpi/test_c.py"]
    assert script.chosen_tests("config", coverage_map, tmp_path, (config, 15)) == ["tests/unit/test_a.py",
                                                                                   "tests/test_b.py"]
    assert script.chosen_tests("config", coverage_map, tmp_path, (config, 12)) == ["tests/unit/test_a.py"]
    # a mutant in an import line, or a line no test executes: the tests that use its file
    for line in (3, 99):
        assert script.chosen_tests("config", coverage_map, tmp_path, (config, line)) == ["tests/unit/test_a.py",
                                                                                         "tests/test_b.py"]
    assert script.ranges([1, 2, 3, 7, 9, 10]) == "1-3,7,9-10" and script.lines_of("1-3,7") == {1, 2, 3, 7}
    assert script.failing_tests(coverage_map) == ["tests/test_fails_already.py"]


def test_a_mutant_is_found_by_its_difference_from_the_tree(tmp_path: Path) -> None:
    script = mutation()
    name = "cai_mpi/_src/config.py"
    lines = (script.ROOT / name).read_text().splitlines(keepends=True)
    for other in script.session_files("config"):
        (tmp_path / other).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / other).write_text((script.ROOT / other).read_text())
    assert script.mutated_line("config", tmp_path) is None
    lines[41] = lines[41].replace("=", "!=", 1) if "=" in lines[41] else "x = 1\n"
    (tmp_path / name).write_text("".join(lines))
    assert script.mutated_line("config", tmp_path) == (name, 42)


PACKAGE = {
    "cai_mpi/__init__.py": "",
    "cai_mpi/_src/__init__.py": "",
    "cai_mpi/_src/alone.py": "X = 1\n",
    "cai_mpi/_src/in_a_child.py": "X = 2\n",
    "cai_mpi/_src/in_the_ranks.py": "X = 3\n",
    "cai_mpi/_src/never.py": "X = 4\n",
    "cai_mpi/_src/cli/__init__.py": "X = 5\n",
    "tests/unit/test_alone.py": "import cai_mpi._src.alone\n\ndef test_it():\n    assert cai_mpi._src.alone.X == 1\n",
    # a top-level test that starts a process of its own, as the tests that start mpiexec or the CLI do
    "tests/test_child.py": ("import subprocess, sys\n\ndef test_it():\n    subprocess.run([sys.executable, '-c',"
                            " 'import cai_mpi._src.in_a_child'], check=True)\n"),
    "tests/mpi/test_ranks.py": ("import pytest\n\n@pytest.mark.mpi\ndef test_it():\n"
                                "    import cai_mpi._src.in_the_ranks\n    import cai_mpi._src.cli\n"),
}


@pytest.mark.timeout(240)
def test_the_map_counts_what_a_test_executes_in_its_subprocesses_and_its_ranks(tmp_path: Path) -> None:
    pytest.importorskip("coverage", minversion="7.10")  # [run] patch = subprocess
    script = mutation()
    for name, text in PACKAGE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    bin_dir = Path(sys.executable).parent
    ours = {"cai_mpi/_src/alone.py", "cai_mpi/_src/in_a_child.py", "cai_mpi/_src/in_the_ranks.py",
            "cai_mpi/_src/never.py"}

    def executed(test_file: str) -> set[str]:
        entry = script.measure(test_file, tmp_path, bin_dir)
        assert entry["status"] == "passed", entry
        assert "cai_mpi/_src/cli/__init__.py" not in entry["files"]  # the command line is no session's
        return set(entry["files"]) & ours

    assert executed("tests/unit/test_alone.py") == {"cai_mpi/_src/alone.py"}
    assert executed("tests/test_child.py") == {"cai_mpi/_src/in_a_child.py"}
    assert executed("tests/mpi/test_ranks.py") == {"cai_mpi/_src/in_the_ranks.py"}


def test_a_stage_leaves_nothing_running(tmp_path: Path) -> None:
    """What a stage starts in the background (a test's own mpiexec) ends with it, also when the stage ran past its
    time: left running, it busy-polled a core through every later mutant."""
    import subprocess
    import time

    script = mutation()
    marker = tmp_path / "alive"
    # a background loop that keeps touching a file for as long as it lives, and holds the stage's output open
    loop = f"(while true; do touch {marker}; sleep 0.05; done &) ; echo started"
    done = script.run_group(["sh", "-c", loop], 10)
    assert (done.returncode, done.stdout.strip()) == (0, "started")
    with pytest.raises(subprocess.TimeoutExpired):
        script.run_group(["sh", "-c", loop + "; sleep 30"], 0.5)
    time.sleep(0.3)
    marker.unlink(missing_ok=True)
    time.sleep(0.5)
    assert not marker.exists(), "a stage's background process outlived it"


REFRESHED = {
    "cai_mpi/__init__.py": "",
    "cai_mpi/_src/__init__.py": "",
    "cai_mpi/_src/used.py": "X = 1\n\n\ndef f():\n    return X\n",
    "cai_mpi/_src/other.py": "Y = 1\n\n\ndef g():\n    return Y\n",
    "tests/unit/test_used.py": "import cai_mpi._src.other\nfrom cai_mpi._src.used import f\n\ndef test_it():\n"
                               "    assert f() == 1\n",
    "tests/unit/test_other.py": "import cai_mpi._src.used\nfrom cai_mpi._src.other import g\n\ndef test_it():\n"
                                "    assert g() == 1\n",
}


@pytest.mark.timeout(240)
def test_a_changed_file_measures_again_only_the_tests_that_use_it(tmp_path: Path) -> None:
    """After a library file changes, the map is refreshed by measuring the test files that use it beyond importing
    it; the others get its new import lines. The result is the map a whole new measurement makes."""
    pytest.importorskip("coverage", minversion="7.10")
    script = mutation()
    for name, text in REFRESHED.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    bin_dir = Path(sys.executable).parent
    tests = ["tests/unit/test_other.py", "tests/unit/test_used.py"]

    def measured() -> dict[str, Any]:
        return {"tests": {name: script.measure(name, tmp_path, bin_dir) for name in tests},
                "digests": script.file_digests(tmp_path)}

    before = measured()
    assert all(entry["digest"] == script.digest_of_test(tmp_path / name) for name, entry in before["tests"].items())
    # f moves down two lines and grows one: every line number of used.py after the first changes
    (tmp_path / "cai_mpi/_src/used.py").write_text("import os\n\nX = 1\n\n\ndef f():\n    y = X\n    return y\n")
    plan = script.refresh_plan(before, script.file_digests(tmp_path))
    assert plan == (["tests/unit/test_used.py"], {"cai_mpi/_src/used.py"})
    again, changed = plan
    refreshed = script.with_import_lines(before, changed, again, script.import_lines(changed, tmp_path, bin_dir))
    refreshed["tests"]["tests/unit/test_used.py"] = script.measure("tests/unit/test_used.py", tmp_path, bin_dir)
    whole = measured()
    assert {n: e["files"] for n, e in refreshed["tests"].items()} == {n: e["files"] for n, e in whole["tests"].items()}
    # a file added (who imports it is not known) or removed: the map is made again whole
    (tmp_path / "cai_mpi/_src/new.py").write_text("Z = 1\n")
    assert script.refresh_plan(whole, script.file_digests(tmp_path)) is None
    assert script.refresh_plan({"tests": {}}, script.file_digests(tmp_path)) is None  # a map from before digests


def test_a_test_file_changed_since_the_map_measured_it_is_measured_again(tmp_path: Path) -> None:
    """A new case in an old test file may run lines its entry does not list: the harness would not choose the file
    for a mutant there (a survivor stays alive although a test kills it). New, changed and undigested files are
    stale; unchanged ones are not."""
    script = mutation()
    names = ["tests/unit/test_a.py", "tests/unit/test_b.py", "tests/test_top.py", "tests/mpi/test_c_mpi.py"]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("def test_it():\n    assert True\n")
    known = {"tests": {name: {"files": {}, "seconds": 0.1, "status": "passed",
                              "digest": script.digest_of_test(tmp_path / name)} for name in names}}
    assert script.stale_tests(known, tmp_path) == []
    (tmp_path / "tests/unit/test_a.py").write_text("def test_it():\n    assert True\n\ndef test_new():\n    pass\n")
    assert script.stale_tests(known, tmp_path) == ["tests/unit/test_a.py"]
    del known["tests"]["tests/mpi/test_c_mpi.py"]["digest"]  # (an entry from before digests were kept)
    (tmp_path / "tests/unit/test_d.py").write_text("def test_it():\n    pass\n")
    assert sorted(script.stale_tests(known, tmp_path)) == sorted(
        ["tests/unit/test_a.py", "tests/unit/test_d.py", "tests/mpi/test_c_mpi.py"])
