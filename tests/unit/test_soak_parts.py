"""The soak's parts that decide what is a failure: message descriptions and their contents, the check of what
arrived, and the report's exit status."""

from __future__ import annotations

import argparse
import dataclasses
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from cai_mpi import Array
from cai_mpi._src.cli.soak.cli import _report
from cai_mpi._src.cli.soak.messages import HOST, LAYOUTS, content, digest, make, problem, spec_for
from cai_mpi._src.cli.soak.report import Sample, memory_allowance, memory_summary, plot, render
from cai_mpi._src.cli.soak.rounds import Worker

SEED = 5
SPECS = [spec_for((i, 0, 1, 2, 0), SEED, 4 << 20) for i in range(400)]


def test_specs_cover_every_layout_exporter_and_size_class() -> None:
    assert {s.layout for s in SPECS} == set(LAYOUTS)
    assert {s.export for s in SPECS} == {HOST, 0, 1, 2, 3}
    assert any(s.nbytes == 0 for s in SPECS) and any(s.nbytes > 1 << 20 for s in SPECS)
    assert any(s.shape == () for s in SPECS) and max(len(s.shape) for s in SPECS) == 4
    assert max(s.nbytes for s in SPECS) <= 4 << 20
    assert spec_for((3, 0, 1, 2, 0), SEED, 4 << 20) == SPECS[3]  # the receiver derives the same description


@pytest.mark.parametrize("runtime", ["host", "simulated"])
def test_every_layout_and_exporter_holds_the_contents(runtime: str) -> None:
    for spec in SPECS[:120]:
        values = content(spec, SEED)
        obj, readback = make(spec, values, runtime)
        assert readback is not None
        assert readback.shape == spec.shape and digest(np.ascontiguousarray(readback)) == digest(values), spec
        if spec.export != HOST:
            assert obj.__cuda_array_interface__["version"] == spec.export


def test_a_changed_byte_a_wrong_shape_or_meta_is_a_problem() -> None:
    spec = next(s for s in SPECS if s.nbytes > 100 and s.dtype != np.bool_)
    values = content(spec, SEED)
    expected = digest(values)
    assert problem(Array.from_host(values.copy()), spec, expected) is None
    changed = values.copy()
    changed.view(np.uint8).reshape(-1)[17] ^= 1
    assert "contents differ" in str(problem(Array.from_host(changed), spec, expected))
    assert "shape" in str(problem(Array.from_host(values.reshape(-1)[:-1].copy()), spec, expected))
    other = dataclasses.replace(spec, dtype=np.dtype(f"V{spec.dtype.itemsize}"))
    assert "dtype" in str(problem(Array.from_host(values.copy()), other, expected))
    assert "meta" in str(problem(Array.from_host(values.copy(), meta={"id": [0]}), spec, expected, {"id": [1]}))


def test_any_failure_makes_the_exit_status_1(capsys: pytest.CaptureFixture[str]) -> None:
    worker = Worker(0, MPI.COMM_SELF, SEED, 1 << 20, 10.0, "host")
    spec = SPECS[7]
    wrong = content(spec, SEED).copy()
    wrong.view(np.uint8).reshape(-1)[:1] ^= 0xFF
    worker.check("exchange", Array.from_host(wrong), spec)
    assert worker.messages == Counter(exchange=1) and len(worker.failures) == 1
    args = argparse.Namespace(warmup=0.2, seed=SEED, max_bytes=1 << 20, json=None, plot=None,
                              command="python -m cai_mpi soak")
    samples = [(0.0, 50.0, 0.0, 1000), (1.0, 60.0, 4.0, 1000)]
    assert _report(args, MPI.COMM_SELF, [worker], [], [], samples, 1.0, 1, "host") == 1
    out = capsys.readouterr().out
    assert "failures: 1" in out and "FAILED: rank 0 thread 0: exchange:" in out
    worker.failures.clear()
    assert _report(args, MPI.COMM_SELF, [worker], [], ["1 request(s) still pending"], samples, 1.0, 1, "host") == 1
    assert _report(args, MPI.COMM_SELF, [worker], [], [], samples, 1.0, 1, "host") == 0


def test_memory_growth_is_measured_after_the_warmup_and_outside_the_pools() -> None:
    # 0-10 s; warm-up to 2 s; a 200 MiB message in flight at 2.5 s and at 9.5 s is not counted (medians)
    rss = [50, 60, 80, 80, 280, 82, 84, 86, 88, 95, 96, 300, 97]
    pooled = [0, 0, 10, 10, 10, 12, 14, 16, 18, 25, 26, 26, 27]
    times = [0, 1, 2, 2.2, 2.5, 2.8, 4, 5, 6, 9, 9.2, 9.5, 10]
    samples = [(t, float(r), float(p), 100) for t, r, p in zip(times, rss, pooled)]
    m = memory_summary(samples, 0.2)
    assert (m["rss_after_warmup_mib"], m["rss_end_mib"], m["rss_peak_mib"]) == (81.0, 96.5, 300.0)
    assert (m["rss_growth_after_warmup_mib"], m["unpooled_growth_after_warmup_mib"]) == (15.5, 0.0)
    assert m["objects_growth_after_warmup"] == 0
    assert "rank 0" in render({"ranks": 2, "threads": 1, "runtime": "host", "mpi_library_version": "MPI",
                               "by_kind": {}, "messages": 0, "bytes": 0, "failures": 0, "seconds": 1.0,
                               "memory_per_rank": [m], "failure_details": [],
                               "memory_allowance": memory_allowance(1 << 20, 1)})


def _run(growth_mib: float, objects: int) -> list[Sample]:
    """Samples over 10 s: flat to the end of the warm-up, then growing by ``growth_mib`` outside the pools (while
    the pools fill by 100 MiB, which is reuse) and by ``objects`` Python objects."""
    times = [i / 2 for i in range(21)]
    return [(t, 100 + 100 * max(0, t - 2) / 8 + growth_mib * max(0, t - 2) / 8, 100 * max(0, t - 2) / 8,
             10_000 + round(objects * max(0, t - 2) / 8)) for t in times]


def test_memory_that_grows_after_the_warmup_fails_the_soak(capsys: pytest.CaptureFixture[str]) -> None:
    """A rank leaking buffers (memory outside the pools) or Python objects fails the run; within the allowance
    (a few of the largest messages in flight per thread; objects by a few hundred) it passes."""
    worker = Worker(0, MPI.COMM_SELF, SEED, 1 << 20, 10.0, "host")
    args = argparse.Namespace(warmup=0.2, seed=SEED, max_bytes=8 << 20, json=None, plot=None,
                              command="python -m cai_mpi soak")
    allowance = memory_allowance(8 << 20, 2)
    assert allowance == {"unpooled_mib": 64 + 4 * 2 * 8, "objects": 2000}
    assert _report(args, MPI.COMM_SELF, [worker], [], [], _run(100, 300), 10.0, 2, "host") == 0
    assert "failures: 0" in capsys.readouterr().out
    assert _report(args, MPI.COMM_SELF, [worker], [], [], _run(400, 0), 10.0, 2, "host") == 1
    out = capsys.readouterr().out
    assert "FAILED: rank 0: memory outside the pools grew by " in out and "(at most 128 MiB" in out, out
    assert _report(args, MPI.COMM_SELF, [worker], [], [], _run(0, 5000), 10.0, 2, "host") == 1
    out = capsys.readouterr().out
    assert "more Python objects after the warm-up than just after it (at most 2,000 is noise)" in out, out


def test_the_memory_plot_is_drawn(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    result = {"messages": 10, "ranks": 2, "threads": 1, "mpi_library_version": "MPI",
              "rss_series_mib": [[[0.0, 50.0, 0.0], [1.0, 60.0, 5.0]], [[0.0, 51.0, 0.0], [1.0, 58.0, 4.0]]]}
    plot(result, str(tmp_path / "memory.png"))
    assert (tmp_path / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
