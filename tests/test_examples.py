"""The examples and the demo are real programs: run them under mpiexec like a user would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch import ROOT, run_ranks


def run(nprocs: int, *args: str) -> str:
    """The program's stdout; a non-zero exit or a hang (over 180 s) fails with everything it printed."""
    done = run_ranks(nprocs, args, timeout=180)
    assert done.returncode == 0, done.output
    return done.stdout


@pytest.mark.parametrize("nprocs", [1, 4])
def test_demo(nprocs: int) -> None:
    out = run(nprocs, "-m", "cai_mpi", "demo", "--size", "32")
    assert "all arrays arrived intact" in out
    assert "MISMATCH" not in out
    # it says what it ran on and why, in words: not a runtime's name ("runtime 'simulated'", issue 34)
    assert "runtime 'simulated'" not in out
    assert " on GPU " in out.splitlines()[0] or " on host memory: no GPU found (" in out.splitlines()[0], out


def test_the_demo_on_host_memory_by_request_says_so() -> None:
    done = run_ranks(2, ["-m", "cai_mpi", "demo", "--size", "8"], timeout=180, env={"CAI_MPI_RUNTIME": "host"})
    assert done.returncode == 0, done.output
    first, second = done.stdout.splitlines()[:2]
    assert first == "cai_mpi demo: 9 arrays around a ring of 2 rank(s) on host memory: CAI_MPI_RUNTIME=host"
    # In plain words (issue 46: "a simulated stream stands in for a GPU's" said nothing to a newcomer).
    assert second == ("No GPU here, so the last array is written by a background thread acting as a GPU stream: "
                      "cai_mpi waits for that writer to finish before sending, as it waits for a GPU's kernels.")


@pytest.mark.parametrize("nprocs", [2, 4])
def test_pipeline_example(nprocs: int) -> None:
    out = run(nprocs, "examples/pipeline.py", "--batches", "5", "--depth", "1")
    assert out.count(": ok") == 5 and "arrived intact" in out and "WRONG" not in out


@pytest.mark.parametrize("nprocs", [3, 4])
def test_pipeline_example_whose_middle_stage_fails(nprocs: int) -> None:
    """Stage 1 raises on batch 2: it reports its own error, every other stage the PipelineError naming stage 1,
    the item and the error; every rank leaves the pipeline and the job exits with status 2, the documented one."""
    done = run_ranks(nprocs, ["examples/pipeline.py", "--batches", "5", "--depth", "1", "--fail-at-batch", "2"],
                     timeout=180)
    assert done.returncode == 2, done.output
    out = done.stdout
    assert out.count("rank 1: failed: StageFailure: batch 2 cannot be transformed") == 1, done.output
    for r in (0, *range(2, nprocs)):
        assert out.count(f"rank {r}: stopped: stage 1 failed on {{'batch': 2}} with __main__.StageFailure: "
                         "batch 2 cannot be transformed") == 1, done.output
    assert "arrived intact" not in out and "WRONG" not in out and "Traceback" not in done.output


@pytest.mark.parametrize("nprocs", [1, 4])
def test_halo_exchange_example(nprocs: int) -> None:
    """A 2-D non-periodic grid: at 1 rank every face is a wall (PROC_NULL), at 4 (2 x 2) each rank has two
    neighbours and two walls."""
    out = run(nprocs, "examples/halo_exchange.py", "--nx", "40", "--ny", "24")
    assert out.count(": ok") == nprocs and "WRONG" not in out
    walls = 4 if nprocs == 1 else 2
    assert out.count(f"{4 - walls} neighbours, {walls} walls: ok") == nprocs, out


def test_halo_exchange_example_benchmarks(tmp_path: Path) -> None:
    """--bench times the exchange, one-shot and over channels, beside hand-written mpi4py and writes the table as
    JSON (a short run)."""
    out = tmp_path / "halo.json"
    text = run(4, "examples/halo_exchange.py", "--nx", "8", "--ny", "8", "--bench", "--sizes", "16,1024", "--iters",
               "3", "--samples", "3", "--json", str(out))
    assert "WRONG" not in text and "cai / raw" in text and "channels / raw" in text, text
    rows = json.loads(out.read_text())["rows"]
    assert [r["face_bytes"] for r in rows] == [128, 8192]
    for r in rows:
        assert r["cai_us"] > 0 and r["channels_us"] > 0 and r["raw_us"] > 0
        assert r["ratio"] == pytest.approx(r["cai_us"] / r["raw_us"])
        assert r["channels_ratio"] == pytest.approx(r["channels_us"] / r["raw_us"])


@pytest.mark.parametrize("nprocs", [1, 4])
def test_allreduce_average_example(nprocs: int) -> None:
    """Gradient averaging of a dict of float32 and float64 parameters with op="mean"."""
    out = run(nprocs, "examples/allreduce_average.py", "--steps", "200")
    assert out.count(": ok") == nprocs and "WRONG" not in out
    assert out.count("(w1: float32, b1: float64, w2: float64)") == nprocs, out


@pytest.mark.parametrize("nprocs", [1, 3])
def test_ring_channel_example(nprocs: int) -> None:
    out = run(nprocs, "examples/ring_channel.py", "--steps", "20", "--size", "100")
    assert out.count(": ok;") == nprocs and "WRONG" not in out


@pytest.mark.parametrize("nprocs", [1, 2])
def test_info_text_and_json(nprocs: int) -> None:
    import json

    text = run(nprocs, "-m", "cai_mpi", "info")
    assert "CUDA-aware" in text and "verdict" in text and text.count("  rank ") == nprocs
    data = json.loads(run(nprocs, "-m", "cai_mpi", "info", "--json"))
    assert len(data["ranks"]) == nprocs
    assert {"cuda_aware", "cuda_aware_source", "mpi_library", "gpu_route", "device_choice"} <= set(data["ranks"][0])
    assert data["ranks"][0]["accelerators"] == [] and "compiled code : none (cai_mpi is pure Python)" in text


def test_every_example_ends_the_job_if_a_rank_fails() -> None:
    """Users copy the examples: each installs cai_mpi.abort_on_error() before it runs main(), so an exception on one
    rank ends the job with its traceback instead of leaving the others blocked."""
    examples = sorted(ROOT.joinpath("examples").glob("*.py"))
    assert examples
    for path in examples:
        entry = path.read_text().split('\nif __name__ == "__main__":\n', 1)
        assert len(entry) == 2, f"{path.name} has no __main__ block"
        hook, run_main = entry[1].find("    cai_mpi.abort_on_error()"), entry[1].find("main()")
        assert 0 <= hook < run_main, f"{path.name}: abort_on_error() is not installed before main() runs"
