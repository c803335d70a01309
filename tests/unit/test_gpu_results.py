"""scripts/gpu_results.py, which turns a run of scripts/test-gpu.sh into docs/gpu-results.md, on FABRICATED input:
the JUnit reports and the fake nvidia-smi below are test fixtures written for this file, not results of any GPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_results.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_results", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_results"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gpu_results = _load()

# -- fixtures: a fabricated run, in the shape pytest --junitxml writes -----------------------------------------------

FABRICATED_1RANK_RANK0 = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">
<testsuite name="pytest" errors="1" failures="0" skipped="3" tests="6">
<testcase classname="tests.gpu.test_fixture_p2p" name="test_fixture_ring[C-staged]" time="0.1" />
<testcase classname="tests.gpu.test_fixture_p2p" name="test_fixture_ring[C-direct]" time="0.0">
  <skipped type="pytest.skip" message="this MPI is not CUDA-aware (fixture reason)">fixture</skipped></testcase>
<testcase classname="tests.gpu.test_fixture_p2p" name="test_fixture_two_gpus" time="0.0">
  <skipped type="pytest.skip" message="needs two GPUs">fixture</skipped></testcase>
<testcase classname="tests.gpu.test_fixture_p2p" name="test_fixture_known_bug" time="0.0">
  <skipped type="pytest.xfail" message="fixture xfail">fixture</skipped></testcase>
<testcase classname="tests.gpu.test_fixture_p2p" name="test_fixture_setup_breaks" time="0.0">
  <error message="failed on setup with &quot;fixture error&quot;">fixture</error></testcase>
<testcase classname="tests.gpu.test_fixture_p2p" name="test_fixture_pipe | in name" time="0.0" />
</testsuite></testsuites>"""

# Rank 1 failed its second test and aborted the job (tests/gpu/conftest.py); rank 0 was killed: no report.
FABRICATED_2RANKS_RANK1 = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">
<testsuite name="pytest" errors="0" failures="1" skipped="1" tests="3">
<testcase classname="tests.gpu.test_fixture_p2p" name="test_fixture_ring[C-staged]" time="0.1" />
<testcase classname="tests.gpu.test_fixture_p2p" name="test_fixture_ring[C-direct]" time="0.0">
  <skipped type="pytest.skip" message="this MPI is not CUDA-aware (fixture reason)">fixture</skipped></testcase>
<testcase classname="tests.gpu.test_fixture_p2p" name="test_fixture_two_gpus" time="0.0">
  <failure message="AssertionError: fixture failure on rank 1&#10;assert 1 == 0">fixture traceback</failure></testcase>
</testsuite></testsuites>"""

FABRICATED_RANK0_PASSES = FABRICATED_2RANKS_RANK1.replace(
    '<failure message="AssertionError: fixture failure on rank 1&#10;assert 1 == 0">fixture traceback</failure>', "")


def fabricated_summary() -> dict[str, object]:
    return {
        "schema": gpu_results.SCHEMA, "date": "2000-01-01 00:00 UTC", "revision": "0123456789ab (fixture)",
        "mode": "system", "wheels": ["mpich-0.0-fixture.whl"],
        "gpus": [{"name": "Fixture GPU 80GB", "driver": "000.00"}], "cuda": "13.0",
        "versions": {"python": "3.12.3", "cupy-cuda13x": "0.0.fixture", "torch": "0.0.fixture+cu130",
                     "MPI library": "Fixture MPI 1.0"},
        "settings": {"CAI_MPI_CHUNK_BYTES": "1048576"},
        "runs": [{"label": "1rank", "ranks": 1, "exit": 1}, {"label": "2ranks", "ranks": 2, "exit": 1}],
    }


@pytest.fixture
def fabricated_run(tmp_path: Path) -> Path:
    (tmp_path / "summary.json").write_text(json.dumps(fabricated_summary()))
    (tmp_path / "1rank-rank0.xml").write_text(FABRICATED_1RANK_RANK0)
    (tmp_path / "2ranks-rank1.xml").write_text(FABRICATED_2RANKS_RANK1)
    return tmp_path


# -- tests ------------------------------------------------------------------------------------------------------

def test_each_testcase_becomes_an_outcome_with_its_reason(fabricated_run: Path) -> None:
    out = gpu_results.Outcome
    assert gpu_results.read_junit(fabricated_run / "1rank-rank0.xml") == {
        "test_fixture_p2p::test_fixture_ring[C-staged]": out("passed"),
        "test_fixture_p2p::test_fixture_ring[C-direct]": out("skipped", "this MPI is not CUDA-aware (fixture reason)"),
        "test_fixture_p2p::test_fixture_two_gpus": out("skipped", "needs two GPUs"),
        "test_fixture_p2p::test_fixture_known_bug": out("xfailed", "fixture xfail"),
        "test_fixture_p2p::test_fixture_setup_breaks": out("error", 'failed on setup with "fixture error"'),
        "test_fixture_p2p::test_fixture_pipe | in name": out("passed"),
    }


def test_the_page_says_what_ran_passed_failed_and_skipped(fabricated_run: Path) -> None:
    summary, runs = gpu_results.load(fabricated_run)
    page = gpu_results.render(summary, runs)
    assert page.startswith("# GPU test results\n\n" + gpu_results.GENERATED)
    for row in [
        "| date | 2000-01-01 00:00 UTC |",
        "| revision | 0123456789ab (fixture) |",
        "| GPU | Fixture GPU 80GB (driver 000.00, CUDA 13.0) |",
        "| packages | the node's own; for this run, installed offline from wheels: mpich-0.0-fixture.whl |",
        "| torch | 0.0.fixture+cu130 |",
        "| MPI library | Fixture MPI 1.0 |",
        "| cai_mpi settings | CAI_MPI_CHUNK_BYTES=1048576 |",
        # run | passed | failed | errors | skipped | not run | exit status
        "| 1 rank | 2 | 0 | 1 | 3 | 0 | 1 |",
        "| 2 ranks | 0 | 1 | 0 | 0 | 5 | 1 |",  # rank 0 left no report: nothing is known to have passed there
        "| `test_fixture_p2p::test_fixture_ring[C-direct]` | skipped: this MPI is not CUDA-aware (fixture reason) "
        "| rank 0: not run: no report from this rank; rank 1: skipped: this MPI is not CUDA-aware (fixture reason) |",
        "| `test_fixture_p2p::test_fixture_two_gpus` | skipped: needs two GPUs | rank 0: not run: no report from this "
        "rank; rank 1: failed: AssertionError: fixture failure on rank 1 |",
        "| `test_fixture_p2p::test_fixture_setup_breaks` | error: failed on setup with \"fixture error\" | rank 0: not "
        "run: no report from this rank; rank 1: not run: the run ended before this test |",
        "| `test_fixture_p2p::test_fixture_pipe \\| in name` | passed |",
    ]:
        assert row in page, row
    assert "2 ranks: no report from rank 0: the run ended before that rank finished" in page
    assert "## Making this page" in page
    assert "Not a GPU run" not in page
    assert "## Benchmarks" not in page  # none were run


def test_benchmark_tables_join_the_page_when_the_run_made_them(fabricated_run: Path) -> None:
    (fabricated_run / "bench.md").write_text("### bench latency --buffer cupy\n\n| size | cai (us) |\n|---|---|\n"
                                             "| 8 B | 0.0 (fixture) |\n")
    done = subprocess.run([sys.executable, str(SCRIPT), "render", str(fabricated_run)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    page = (fabricated_run / "gpu-results.md").read_text()
    assert "## Benchmarks" in page and "### bench latency --buffer cupy" in page and "| 8 B | 0.0 (fixture) |" in page
    assert page.index("## Benchmarks") < page.index("## Making this page")


def test_a_run_on_the_driver_double_says_it_was_not_a_gpu_run(fabricated_run: Path) -> None:
    summary, runs = gpu_results.load(fabricated_run)
    summary["settings"] = {"CAI_MPI_TEST_CUDA_DRIVER": "cai_mpi.testing.cuda_driver:CudaDriverDouble"}
    page = gpu_results.render(summary, runs)
    assert "**Not a GPU run:** cai_mpi talked to a stand-in for the GPU (cai_mpi.testing.cuda_driver:" in page


def test_ranks_that_agree_share_one_cell(tmp_path: Path) -> None:
    summary = {**fabricated_summary(), "runs": [{"label": "2ranks", "ranks": 2, "exit": 0}]}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "2ranks-rank0.xml").write_text(FABRICATED_RANK0_PASSES)
    (tmp_path / "2ranks-rank1.xml").write_text(FABRICATED_RANK0_PASSES)
    page = gpu_results.render(*gpu_results.load(tmp_path))
    assert "| `test_fixture_p2p::test_fixture_two_gpus` | passed |" in page
    assert "| 2 ranks | 2 | 0 | 0 | 1 | 0 | 0 |" in page
    assert "no report from rank" not in page


def fake_nvidia_smi(tmp_path: Path, script: str) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return str(path)


def test_collect_reads_the_gpus_and_the_cuda_version_from_nvidia_smi(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    smi = fake_nvidia_smi(tmp_path, 'if [ "$1" = --query-gpu=name,driver_version ]; then\n'
                                    '  echo "Fixture GPU A, 000.01"; echo "Fixture GPU B, 000.01"\n'
                                    'else echo "| Driver Version: 000.01   CUDA Version: 13.0 |"; fi\n')
    monkeypatch.setenv("CAI_MPI_CHUNK_BYTES", "4096")
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "fixture_pkg-0.0-py3-none-any.whl").write_bytes(b"")
    summary = gpu_results.collect("system", [("1rank", 1, 0)], revision="fixture", wheels=tmp_path / "wheels",
                                  nvidia_smi=smi)
    assert summary["wheels"] == ["fixture_pkg-0.0-py3-none-any.whl"] and summary["mode"] == "system"
    assert summary["settings"]["CAI_MPI_CHUNK_BYTES"] == "4096"
    assert summary["gpus"] == [{"name": "Fixture GPU A", "driver": "000.01"},
                               {"name": "Fixture GPU B", "driver": "000.01"}]
    assert summary["cuda"] == "13.0" and summary["runs"] == [{"label": "1rank", "ranks": 1, "exit": 0}]
    assert summary["versions"]["python"] and summary["versions"]["mpi4py"]
    assert summary["versions"]["MPI library"]


def test_a_failing_nvidia_smi_is_recorded_with_its_message(tmp_path: Path) -> None:
    smi = fake_nvidia_smi(tmp_path, 'echo "NVIDIA-SMI has failed because it could not communicate with the driver"'
                                    "\nexit 9\n")
    summary = gpu_results.collect("system", [], revision="fixture", nvidia_smi=smi)
    assert summary["gpus"] == [] and "exit 9" in summary["error"] and "could not communicate" in summary["error"]
    page = gpu_results.render(summary, [])
    assert "| GPU | none listed: " in page and "could not communicate with the driver" in page


def test_the_command_line_writes_the_page_and_prints_the_skip_reasons(fabricated_run: Path) -> None:
    page = fabricated_run / "page.md"
    done = subprocess.run([sys.executable, str(SCRIPT), "render", str(fabricated_run), "-o", str(page)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert page.read_text().startswith("# GPU test results")
    assert "1 rank: 1 error, 2 passed, 2 skipped, 1 xfailed (exit 1)" in done.stdout
    assert "1 x skipped: needs two GPUs" in done.stdout
    assert "2 ranks: 1 failed, 5 not run (exit 1)" in done.stdout


def test_render_without_a_summary_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"run scripts/test-gpu\.sh"):
        gpu_results.load(tmp_path)


def test_the_published_page_is_generated_or_says_no_gpu_run_was_made() -> None:
    page = (ROOT / "docs" / "gpu-results.md").read_text()
    assert gpu_results.GENERATED in page or "**No GPU run has been made of this revision yet.**" in page
    assert gpu_results.HOW_TO_MAKE_THIS_PAGE in page  # one text of how to make it, in the script and the page
