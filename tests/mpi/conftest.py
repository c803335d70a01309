"""Under mpiexec: a failure or a hang on any rank ends the whole run at once, naming the test, and every rank
reports what it ran.

A failed assertion on one rank used to leave the other ranks waiting in a collective until the outer
time limit, with no output. Now the failing rank prints its report to stderr and aborts
MPI_COMM_WORLD, so mpiexec ends within seconds and the assertion text is in the output.

A test still running after ``CAI_MPI_TEST_HANG_SECONDS`` (50 by default; a ``timeout`` marker of the test or its
module gives it that long instead) is a hang: a watchdog thread on each rank records the test as failed, writes
its main thread's stack to ``rank<N>.stack`` in the report directory, and the first rank to get there prints
``FAILED <test> (hung ...)`` with its own stack, alone, then aborts MPI_COMM_WORLD. ``tests/test_under_mpiexec.py``
then starts the run again after that test, so the rest of the world size still runs and reports.

Every rank also writes a summary (passed, failed, skipped with reasons, every test that finished) to
``$CAI_MPI_TEST_REPORT_DIR/rank<N>.json`` when that variable is set, which ``tests/test_under_mpiexec.py``
reads: the outer run then knows exactly what ran on each rank and shows the inner skips. Tests named in
``$CAI_MPI_TEST_DONE_FILE`` (one node id a line: those an earlier, aborted run finished) are deselected.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mpi4py import MPI

_summary: dict[str, Any] = {"passed": 0, "failed": [], "skipped": [], "done": [], "hung": None}
HANG_SECONDS = float(os.environ.get("CAI_MPI_TEST_HANG_SECONDS", "50"))


_config: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    _config.append(config)


def _under_mpiexec() -> bool:
    return MPI.COMM_WORLD.Get_size() > 1


def _report_dir() -> Path | None:
    where = os.environ.get("CAI_MPI_TEST_REPORT_DIR")
    return Path(where) if where else None


def _write_summary() -> None:
    where = _report_dir()
    if where:
        path = where / f"rank{MPI.COMM_WORLD.Get_rank()}.json"
        # Whole or not at all: a rank may be killed mid-write (another rank's abort), and a half-written
        # summary would fail the outer run's reading of it. One partial file per thread: the watchdog may write
        # while the main thread does.
        partial = path.with_suffix(f".partial{threading.get_ident()}")
        partial.write_text(json.dumps(_summary))
        os.replace(partial, path)


_LIMIT = pytest.StashKey[float]()
BACKSTOP = 60  # s past the watchdog: pytest-timeout's own limit, should the watchdog thread never run


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's hang limit (the watchdog's; pytest-timeout's moved past it, so that the watchdog speaks first);
    a run started again after an abort leaves out what the aborted run finished (and the test that ended it)."""
    for item in items:
        marker = item.get_closest_marker("timeout")
        limit = float(marker.args[0]) if marker is not None and marker.args else HANG_SECONDS
        item.stash[_LIMIT] = limit
        item.add_marker(pytest.mark.timeout(limit + BACKSTOP), append=False)
    done_file = os.environ.get("CAI_MPI_TEST_DONE_FILE")
    if not done_file:
        return
    done = set(Path(done_file).read_text().splitlines())
    gone = [item for item in items if item.nodeid in done]
    if gone:
        items[:] = [item for item in items if item.nodeid not in done]
        config.hook.pytest_deselected(items=gone)


_PLUMBING = ("/_pytest/", "/pluggy/", "/pytest/__main__.py", "<frozen runpy>")  # frames left out of a hang's stack


def _hung(nodeid: str, seconds: float, main: int) -> None:
    """The watchdog's verdict: the test is failed, this rank's stack kept, one rank prints, the job ends."""
    rank = MPI.COMM_WORLD.Get_rank()
    frame = sys._current_frames().get(main)
    frames = [f for f in traceback.extract_stack(frame) if not any(part in f.filename for part in _PLUMBING)]
    stack = "".join(traceback.format_list(frames)) if frame is not None else "(no stack)\n"
    _summary["failed"].append(nodeid)
    _summary["hung"] = nodeid
    _write_summary()
    where, first = _report_dir(), True
    if where is not None:  # the first rank here prints; the others' stacks are in their files (shown after it)
        with contextlib.suppress(OSError):
            (where / f"rank{rank}.stack").write_text(stack)
        try:
            fd = os.open(where / "hung", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.write(fd, str(rank).encode())
            os.close(fd)
        except FileExistsError:
            first = False
        except OSError:
            pass
    if first:
        capture = _config[0].pluginmanager.getplugin("capturemanager") if _config else None
        if capture is not None:  # (the test's output is being captured: this goes to the job's own stderr)
            capture.suspend_global_capture(in_=True)
        sys.stdout.flush()
        sys.stderr.write(f"\n==== rank {rank}: FAILED {nodeid} (hung: still running after {seconds:g} s); aborting "
                         f"MPI_COMM_WORLD ====\n---- rank {rank}'s main thread ----\n{stack}")
        sys.stderr.flush()
        if where is not None:
            _await_stacks(where)
    else:
        time.sleep(STACK_WAIT + 5)  # (the first rank's abort ends this one; if it never comes, abort from here)
    _abort()


def _abort() -> None:
    """End the job, once the launcher has read what this rank wrote (MPICH's hydra may drop it otherwise)."""
    from cai_mpi._src.api.abort import _let_the_launcher_read

    _let_the_launcher_read()
    MPI.COMM_WORLD.Abort(1)


STACK_WAIT = 15.0  # s at most the first hung rank waits for the others' verdicts before it aborts them


def _await_stacks(where: Path) -> None:
    """Every rank's watchdog fires within the skew of the test's start, a moment apart: an abort before another
    rank's own verdict would lose its stack and its record of the hang (its summary says nothing of the test)."""
    deadline = time.monotonic() + STACK_WAIT
    stacks = [where / f"rank{r}.stack" for r in range(MPI.COMM_WORLD.Get_size())]
    while time.monotonic() < deadline and not all(path.exists() for path in stacks):
        time.sleep(0.05)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A watchdog over the whole test (setup, call, teardown) while under mpiexec."""
    if not _under_mpiexec():
        yield
        return
    seconds = item.stash.get(_LIMIT, HANG_SECONDS)
    watchdog = threading.Timer(seconds, _hung, (item.nodeid, seconds, threading.get_ident()))
    watchdog.daemon = True
    watchdog.start()
    try:
        yield
    finally:
        watchdog.cancel()
    _summary["done"].append(item.nodeid)
    _write_summary()  # (another rank's abort can end this one at any moment: what it ran so far is on record)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and _under_mpiexec():
        rank = MPI.COMM_WORLD.Get_rank()
        _summary["failed"].append(item.nodeid)
        _write_summary()
        sys.stdout.flush()
        sys.stderr.write(
            f"\n==== rank {rank}: FAILED {item.nodeid} (in {report.when}); aborting MPI_COMM_WORLD ====\n"
            f"{report.longreprtext}\n"
        )
        sys.stderr.flush()
        _abort()  # the other ranks may be waiting for this one: end them all now


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.passed and report.when == "call":
        _summary["passed"] += 1
    elif report.skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        _summary["skipped"].append([report.nodeid, reason.removeprefix("Skipped: ")])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _write_summary()


# -- device set-up shared by the tests ----------------------------------------------------------------------------


def _routed_dup(aware: bool, of: MPI.Comm = MPI.COMM_WORLD) -> MPI.Intracomm:
    """A duplicate of ``of`` on which device data goes to MPI in place (``aware``) or is staged through the host:
    cai_mpi detects CUDA-awareness once per communicator, at its first use, so it is detected here with
    ``CAI_MPI_CUDA_AWARE`` set (and the variable put back as it was)."""
    import cai_mpi

    before = os.environ.get("CAI_MPI_CUDA_AWARE")
    os.environ["CAI_MPI_CUDA_AWARE"] = "1" if aware else "0"
    try:
        dup = of.Dup()
        detected = cai_mpi.cuda_aware(dup)
    finally:
        if before is None:
            del os.environ["CAI_MPI_CUDA_AWARE"]
        else:
            os.environ["CAI_MPI_CUDA_AWARE"] = before
    assert detected.aware is aware, detected
    return dup


@contextlib.contextmanager
def _on_double(aware: bool, *, lazy: float = 0.0, settings: dict[str, str] | None = None) -> Iterator[Any]:
    """``(runtime, comm)``: cai_mpi's CUDA runtime on a driver double in use (its device memory readable by MPI
    when ``aware``, as a CUDA-aware MPI needs; ``lazy`` as ``double_runtime`` takes it), a ``_routed_dup`` of
    COMM_WORLD and ``settings`` as the configuration; all undone on leaving, once every rank has left."""
    from cai_mpi._src.config import reload_config
    from cai_mpi.testing import double_runtime, use_runtime

    comm = _routed_dup(aware)
    if settings is not None:
        reload_config(settings)
    runtime = double_runtime(cuda_aware=aware, lazy=lazy)
    try:
        with use_runtime(runtime):
            yield runtime, comm
            gc.collect()  # finalizers that free device memory run while the double is alive
    finally:
        comm.Barrier()
        comm.Free()
        reload_config()
        runtime.driver_double.close()  # type: ignore[attr-defined]


@pytest.fixture
def comm() -> Iterator[MPI.Intracomm]:
    """A duplicate of COMM_WORLD for one test (a module may define its own ``comm`` fixture, which wins), freed once
    every rank has left the test."""
    dup = MPI.COMM_WORLD.Dup()
    try:
        yield dup
    finally:
        dup.Barrier()
        dup.Free()


@pytest.fixture
def routed_dup() -> Any:
    """``routed_dup(aware, of=COMM_WORLD)``: a duplicate of ``of`` routing device data in place or staged."""
    return _routed_dup


@pytest.fixture
def on_double() -> Any:
    """``with on_double(aware, lazy=0.0, settings=None) as (runtime, comm)``: the CUDA runtime on a driver double."""
    return _on_double
