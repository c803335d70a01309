"""Mutation testing of cai_mpi's core modules with cosmic-ray (docs/testing.md, "Mutation testing").

A maintainer's tool, too slow for every CI run. For each core module it plants one small bug at a time (cosmic-ray's
mutants) in a scratch copy of the tree and runs the tests that cover that module: every test file that executes one
of its files (the coverage map, .mutation/coverage-map.json): the one-process ones, then the MPI test files under
``mpiexec -n 2`` and ``-n 3``, each stage stopping at the first failure. A mutant the tests reject is killed; one they
pass is a survivor to kill with a test or to explain in docs/testing.md.

    python scripts/mutation.py map [TEST_FILE ...]                        # which files each test file executes
    python scripts/mutation.py run [MODULE ...] [--sample N] [--seed S]   # mutate and test (resumable)
    python scripts/mutation.py report [MODULE ...] [--json FILE]          # score per module, survivors' diffs
    python scripts/mutation.py test MODULE                                # the per-mutant test command itself

Sessions live in .mutation/<module>.sqlite (cosmic-ray's work database): an interrupted ``run`` goes on where it
stopped, over the module's sources as they were (after they change, a new session begins); ``--fresh`` starts
over. ``--sample N`` tests N mutants per module, drawn at random with ``--seed`` (the
rest are recorded as skipped), for a quick look; without it every mutant runs. The venv is $CAI_MPI_MUTATION_VENV
(default .venv-mut): cosmic-ray, coverage and cai_mpi[test,mpich] installed in it (docs/testing.md says how).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STATE = ROOT / ".mutation"
VENV = Path(os.environ.get("CAI_MPI_MUTATION_VENV", ROOT / ".venv-mut"))
BIN = VENV / "bin"

# module -> the files one cosmic-ray session mutates. Every module under cai_mpi/_src outside cli/ is in exactly one
# entry (``uncovered()`` says which are not; tests/unit/test_mutation_coverage.py checks it). The tests a session runs
# are not listed here: they are the test files that execute its files, read from the coverage map (``map``).
MODULES: dict[str, list[str]] = {
    "sync": ["cai_mpi/_src/arrays/sync.py"],
    "header": ["cai_mpi/_src/core/header.py"],
    "descriptor": ["cai_mpi/_src/core/descriptor.py"],
    "operands": ["cai_mpi/_src/arrays/operands.py"],
    "reductions": ["cai_mpi/_src/api/reductions.py", "cai_mpi/_src/api/reduce_ops.py"],
    "pipeline": ["cai_mpi/_src/api/pipeline.py", "cai_mpi/_src/api/pipeline_wire.py",
                 "cai_mpi/_src/api/pipeline_leave.py"],
    "channel": ["cai_mpi/_src/api/channel.py", "cai_mpi/_src/api/channel_ends.py"],
    "collectives": ["cai_mpi/_src/api/collectives.py", "cai_mpi/_src/api/gathers.py",
                    "cai_mpi/_src/api/collective_call.py", "cai_mpi/_src/api/scatters.py",
                    "cai_mpi/_src/api/arrival.py"],
    "requests": ["cai_mpi/_src/progress/requests.py", "cai_mpi/_src/progress/posted.py",
                 "cai_mpi/_src/progress/driving.py", "cai_mpi/_src/progress/backoff.py"],
    "transport": ["cai_mpi/_src/transport"],
    "persistent": ["cai_mpi/_src/api/persistent.py", "cai_mpi/_src/api/persistent_init.py",
                   "cai_mpi/_src/api/bucketed.py", "cai_mpi/_src/api/bucket_plan.py", "cai_mpi/_src/api/agreed.py"],
    "lifecycle": ["cai_mpi/_src/api/lifecycle.py"],
    "completion": ["cai_mpi/_src/api/completion.py"],
    "array": ["cai_mpi/_src/arrays/array.py", "cai_mpi/_src/arrays/dlpack.py"],
    "core": ["cai_mpi/_src/core/typestr.py", "cai_mpi/_src/core/meta.py", "cai_mpi/_src/core/memo.py",
             "cai_mpi/_src/core/__init__.py"],
    "waits": ["cai_mpi/_src/progress/waits.py", "cai_mpi/_src/progress/deadlines.py",
              "cai_mpi/_src/progress/__init__.py"],
    "p2p": ["cai_mpi/_src/api/p2p.py", "cai_mpi/_src/api/validation.py", "cai_mpi/_src/api/abort.py",
            "cai_mpi/_src/api/__init__.py", "cai_mpi/_src/arrays/__init__.py", "cai_mpi/_src/__init__.py"],
    "config": ["cai_mpi/_src/config.py", "cai_mpi/_src/errors.py"],
    "runtime": ["cai_mpi/_src/runtime"],
}


def uncovered() -> list[str]:
    """The modules under cai_mpi/_src (outside cli/) that no MODULES entry mutates."""
    covered: set[Path] = set()
    for paths in MODULES.values():
        for name in paths:
            path = ROOT / name
            covered |= set(path.rglob("*.py")) if path.is_dir() else {path}
    src = ROOT / "cai_mpi" / "_src"
    return sorted(str(p.relative_to(ROOT)) for p in src.rglob("*.py") if "cli" not in p.relative_to(src).parts[:1]
                  and p not in covered)

# Survivors judged equivalent (no input can tell them from the original), with why: (file, operator, occurrence) ->
# reason. Occurrences number the operator's sites in the file: re-judge these when the file changes.
# (pipeline.py's earlier judgements went when it was split into pipeline, pipeline_wire and pipeline_leave: their
# occurrences named other code after the split; docs/testing.md lists what they were.)
JUDGED_EQUIVALENT: dict[tuple[str, str, int], str] = {
    ("cai_mpi/_src/api/persistent.py", "core/NumberReplacer", 13):
        "equivalent: a persistent collective's send address keeps its initial value only where nothing reads it: "
        "a bcast's other ranks post their receive buffer, and device memory is posted per use at the addresses of "
        "that use",
    ("cai_mpi/_src/api/persistent.py", "core/NumberReplacer", 14):
        "equivalent: a persistent collective's receive address keeps its initial value only where nothing reads "
        "it: a bcast's root posts its own buffer, a reduce's other ranks pass no receive buffer, and device "
        "memory is posted per use at the addresses of that use",
    ("cai_mpi/_src/api/persistent.py", "core/ReplaceComparisonOperator_Eq_LtE", 9):
        "equivalent: the kinds are allgather, allreduce, bcast and reduce, and none but allgather sorts at or "
        "below 'allgather', so '<=' picks the same kinds as '=='",
    ("cai_mpi/_src/api/persistent.py", "core/NumberReplacer", 9):
        "equivalent: the chunk size in a persistent collective's own description is never read: it lands only "
        "through Landing.plan, which reads its dtype, shape, order, size and meta (chunks are the point-to-point "
        "receive's)",
    ("cai_mpi/_src/api/collectives.py", "core/ReplaceComparisonOperator_NotEq_IsNot", 1):
        "untestable here: ranks are ints, and CPython shares those up to 256, so 'me is not sig.root' holds exactly "
        "when 'me != sig.root' does in any world this suite can start (as scatters.py's 'me is root' above)",
    ("cai_mpi/_src/api/scatters.py", "core/ReplaceComparisonOperator_Eq_Is", 1):
        "untestable here: ranks are ints, and CPython shares those up to 256, so 'me is root' holds exactly when "
        "'me == root' does in any world this suite can start; from rank 257 on, the root of a scatter that failed "
        "on it would raise CollectiveMismatchError instead of its own error",
    ("cai_mpi/_src/arrays/sync.py", "core/NumberReplacer", 1):
        "version >= 2: a descriptor below version 3 never holds a stream (descriptor_from_dict drops it with a "
        "warning), so 'stream is not None' decides alone",
    ("cai_mpi/_src/arrays/sync.py", "core/ReplaceComparisonOperator_IsNot_NotEq", 0):
        "equivalent: enum members compare by identity, so 'kind != MemoryKind.HOST' is 'kind is not MemoryKind.HOST'",
    ("cai_mpi/_src/arrays/operands.py", "core/NumberReplacer", 2):
        "equivalent: host_view's 'desc.ptr == 0' is only reached with size > 0, where descriptor_from_dict has "
        "already refused a NULL pointer; 'ptr == 1' differs only for an array at address 1, which no allocator gives",
    ("cai_mpi/_src/progress/requests.py", "core/ReplaceComparisonOperator_Lt_LtE", 0):
        "equivalent: 'now <= spin_until' spins at one more instant of a float clock than 'now < spin_until'",
    ("cai_mpi/_src/progress/requests.py", "core/ReplaceUnaryOperator_USub_Not", 2):
        "harmless: the same fallback description in PostedRequest (peer -1 becomes 0); a PostedRequest made without "
        "one is either empty (PROC_NULL: complete at once) or abandoned without a wait (collectives)",
    ("cai_mpi/_src/progress/requests.py", "core/ReplaceUnaryOperator_Delete_USub", 1):
        "harmless: the fallback description of a request made without one changes its tag from -1 to 1; every "
        "request a public call can time out is made with its own description",
    ("cai_mpi/_src/api/pipeline.py", "core/ReplaceComparisonOperator_Eq_LtE", 8):
        "equivalent: a stage holding a description receives only FAST (taken before), END or SWITCH on its bare "
        "receive (the previous stage sends SWITCH before any self-described item), and of END (1) and SWITCH (4) "
        "'tag <= END' holds for END alone, as 'tag == END' does",
    ("cai_mpi/_src/api/pipeline_leave.py", "core/ReplaceBinaryOperator_Mul_Div", 0):
        "equivalent: '_notify(self, error, /, own=True)' for '_notify(self, error, *, own=True)': both of its calls "
        "pass the error by position and own by keyword (or not at all), which both signatures accept",
    ("cai_mpi/_src/arrays/operands.py", "core/ReplaceBinaryOperator_Add_Pow", 2):
        "equivalent: 't_ptr ** t_low' (t_low <= 0: 1 or a float below 1) only turns off replaces' early exit for a "
        "sent array wholly below out=; np.shares_memory, which comes next and is exact, then says False as well",
    ("cai_mpi/_src/api/p2p.py", "core/ReplaceComparisonOperator_LtE_Lt", 1):
        "equivalent: the fast path's tag test is a shortcut; with '0 < tag' a tag of 0 goes to check_tag, which "
        "accepts it and returns it unchanged",
    ("cai_mpi/_src/api/validation.py", "core/ReplaceComparisonOperator_Eq_Is", 0):
        "equivalent: check_rank's first test is a shortcut; a rank it misses ('is' failing) reaches the general "
        "test just below, which accepts ANY_SOURCE by '==' (and CPython caches ANY_SOURCE, -1 or -2, anyway)",
    ("cai_mpi/_src/api/pipeline_leave.py", "core/NumberReplacer", 12):
        "equivalent: a stage reads only its downstream neighbour's credits in the leaving agreement "
        "(everyone[me + 1, _CREDITS]), and the first stage, the only one without an upstream, is no stage's "
        "downstream neighbour",
    ("cai_mpi/_src/core/header.py", "core/ReplaceBinaryOperator_BitOr_Add", 2):
        "equivalent: FLAG_META (0x04) and FLAG_FORTRAN (0x08) are distinct bits, so their sum is their union",
    ("cai_mpi/_src/api/reductions.py", "core/AddNot", 9):
        "harmless: 'not key[0] is not None' only stops remembering plans (each call plans again, to the same plan); "
        "key[0] is None only for an op that is neither a name nor an MPI.Op, which parse_op refuses first",
    ("cai_mpi/_src/api/channel.py", "core/ReplaceComparisonOperator_Eq_Is", 1):
        "equivalent in CPython: check_rank returns the source as a Python int, and PROC_NULL (-1 on MPICH, -2 on "
        "Open MPI) is among the small ints CPython shares, so 'is PROC_NULL' holds exactly when '==' does",
    ("cai_mpi/_src/api/gathers.py", "core/ReplaceBinaryOperator_Mul_Div", 10):
        "untestable here: in the one-round guard '_record(sig.nbytes) / size' differs from '* size' only when a "
        "record (at most SPECULATE_BYTES and 24 bytes of words) times the world's size passes INT_MAX: above 32,755 "
        "ranks",
    ("cai_mpi/_src/api/gathers.py", "core/ReplaceBinaryOperator_Mul_Div", 11):
        "untestable here: in the steady-state guard 'sig.nbytes / size' differs from 'sig.nbytes * size' only when "
        "a piece (at most SPECULATE_BYTES, 64 KiB) times the world's size passes INT_MAX: above 32,768 ranks",
    ("cai_mpi/_src/api/gathers.py", "core/ReplaceBinaryOperator_Mul_FloorDiv", 11):
        "untestable here: in the steady-state guard 'sig.nbytes // size' differs from 'sig.nbytes * size' only when "
        "a piece (at most SPECULATE_BYTES, 64 KiB) times the world's size passes INT_MAX: above 32,768 ranks",
    ("cai_mpi/_src/transport/receive.py", "core/NumberReplacer", 4):
        "equivalent: the payload tag of the plan of an inline message received into a numpy out= is never read: the "
        "plan posts no payload message (NO_MESSAGES) and has no steps, so 'ptag' 0 or 1 makes no call differ",
    ("cai_mpi/_src/api/abort.py", "core/NumberReplacer", 1):
        "harmless: the most an abort waits for the launcher to read a rank's last output; the wait ends as soon as "
        "the pipes are empty (milliseconds here), so 1 s for 2 s matters only to a launcher that stalls over 1 s",
    ("cai_mpi/_src/transport/slots.py", "core/ReplaceBinaryOperator_BitAnd_FloorDiv", 3):
        "equivalent: a slot's head carries three flags, _FUSED 1, _APART 2 and _LONG 4 (a cai_mpi rank writes it on "
        "a private communicator), so 'marks // _LONG' is nonzero exactly when 'marks & _LONG' is",
    ("cai_mpi/_src/progress/deadlines.py", "core/ReplaceComparisonOperator_Eq_Is", 1):
        "equivalent: check_tag returns every tag as a Python int (numpy.int64(-1) too), ANY_TAG is -1 on both "
        "wheels and CPython caches -1, so 'tag is ANY_TAG' holds exactly when 'tag == ANY_TAG' does",
}

# World sizes per module (default 2 and 3): a pipeline of 4 has two middle stages, which index their neighbours.
RANKS: dict[str, tuple[int, ...]] = {"pipeline": (2, 3, 4)}

STAGE_TIMEOUT = int(os.environ.get("CAI_MPI_MUTATION_STAGE_TIMEOUT", "120"))  # one stage of one mutant, seconds
TEST_TIMEOUT = 30  # one test inside a stage (pytest-timeout): a mutant that hangs a wait fails fast


# The coverage map: which library lines each test file executes, in its own process, in every rank it starts under
# mpiexec and in every Python subprocess it starts. A mutant runs every test file that executes its line. Line
# numbers are the library's of one revision, so the map is made for the sources it was measured on (``library``, a
# digest of them; ``digests``, one per file) and ``run`` refreshes it when they differ (``refresh_plan``).
MAP = STATE / "coverage-map.json"
# Test files that run other test files again at other world sizes: the files they run are in the map themselves, and
# every session would otherwise run the whole suite per mutant.
RERUNNERS = {"tests/test_under_mpiexec.py", "tests/test_collectives_at_scale.py"}
MARKERS = "not slow and not gpu and not slurm"
MAP_RANKS = 2  # the world size tests/mpi files are measured at
MAP_TIMEOUT = 600  # one test file, seconds


def test_files(root: Path = ROOT) -> list[str]:
    """Every test file the map measures: tests/unit (with its folders), the top-level tests/test_*.py, tests/mpi."""
    tests = root / "tests"
    found = [*sorted((tests / "unit").rglob("test_*.py")), *sorted(tests.glob("test_*.py")),
             *sorted((tests / "mpi").glob("test_*.py"))]
    return [name for name in (str(p.relative_to(root)) for p in found) if name not in RERUNNERS]


def library_file(path: str, root: Path = ROOT) -> str | None:
    """``path`` (as coverage measured it) relative to ``root`` when it is a library module outside cli/, else None."""
    try:
        rel = Path(path).resolve().relative_to(root.resolve())
    except ValueError:
        return None
    parts = rel.parts
    if parts[:2] != ("cai_mpi", "_src") or (len(parts) > 2 and parts[2] == "cli"):
        return None
    return str(rel)


def measure(test_file: str, root: Path = ROOT, bin_dir: Path = BIN) -> dict[str, Any]:
    """Run ``test_file`` under coverage (under mpiexec for tests/mpi) and say which library files it executed.

    Failing tests still count: what a test executes before it fails is what a mutant there can break."""
    import tempfile

    import coverage

    digest = digest_of_test(root / test_file)  # (before it runs: the file as measured)
    with tempfile.TemporaryDirectory(prefix="cai-mpi-map-") as tmp:
        rc = Path(tmp) / "coveragerc"
        # patch = subprocess: every Python process the test starts (mpiexec's ranks, the CLI) measures itself too
        rc.write_text(f"[run]\nparallel = true\nsource = cai_mpi\ndata_file = {tmp}/.coverage\n"
                      "patch = subprocess\n")
        env = {**os.environ, "PYTHONPATH": str(root), "OMPI_ALLOW_RUN_AS_ROOT": "1",
               "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
        python = [str(bin_dir / "python"), "-m", "coverage", "run", f"--rcfile={rc}", "-m", "pytest", "-q",
                  "-p", "no:cacheprovider", "-m", MARKERS]
        if test_file.startswith("tests/mpi/"):
            command = [str(bin_dir / "mpiexec"), "-n", str(MAP_RANKS), *python, "--with-mpi", test_file]
        else:
            command = [*python, test_file]
        start = time.monotonic()
        try:
            outcome = run_group(command, MAP_TIMEOUT, cwd=root, env=env)
            status = "passed" if outcome.returncode == 0 else f"exit {outcome.returncode}"
        except subprocess.TimeoutExpired:
            status = "timed out"
        seconds = round(time.monotonic() - start, 1)
        cov = coverage.Coverage(data_file=f"{tmp}/.coverage", config_file=str(rc))
        cov.combine()
        data = cov.get_data()
        executed: dict[str, list[int]] = {}
        for measured in data.measured_files():
            name, lines = library_file(measured, root), data.lines(measured)
            if name is not None and lines:
                executed[name] = sorted(set(executed.get(name, [])) | set(lines))
    return {"files": {name: ranges(executed[name]) for name in sorted(executed)}, "seconds": seconds,
            "status": status, "digest": digest}


def ranges(lines: list[int]) -> str:
    """Sorted line numbers as "1-3,7,9-10" (the map stays a reviewable size)."""
    runs: list[list[int]] = []
    for line in lines:
        if runs and line == runs[-1][1] + 1:
            runs[-1][1] = line
        else:
            runs.append([line, line])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def library_digest(root: Path = ROOT) -> str:
    """A digest of the library's sources outside cli/ (what the map's line numbers refer to)."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted((root / "cai_mpi" / "_src").rglob("*.py")):
        name = str(path.relative_to(root))
        if library_file(str(path), root) is not None:
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def file_digests(root: Path = ROOT) -> dict[str, str]:
    """Each library source's own digest (outside cli/): what tells a map which files changed since it was made."""
    import hashlib

    return {name: hashlib.sha256(path.read_bytes()).hexdigest()[:16]
            for path in sorted((root / "cai_mpi" / "_src").rglob("*.py"))
            if (name := library_file(str(path), root)) is not None}


def current_map() -> dict[str, Any]:
    """The coverage map for the library as it is: made first if missing, refreshed where the library changed (the
    test files that use a changed file measured again), completed with new test files."""
    known = json.loads(MAP.read_text()) if MAP.exists() else None
    plan = None
    if known is not None and known.get("library") != library_digest():
        plan = refresh_plan(known, file_digests())
        if plan is None:
            known = None
    if known is None:
        print("== the coverage map is missing, or a library file was added or removed: measuring every test file",
              flush=True)
        build_map()
    else:
        again: list[str] = []
        if plan is not None:
            again, changed = plan
            print(f"== {len(changed)} library file(s) changed since the coverage map: {len(again)} test file(s) use "
                  "them", flush=True)
            known = with_import_lines(known, changed, again, import_lines(changed))
        new = sorted({*again, *stale_tests(known)})
        if new or plan is not None:
            print(f"== measuring {len(new)} test file(s) again or for the first time", flush=True)
            build_map(new, known)
    return dict(json.loads(MAP.read_text()))


def refresh_plan(known: dict[str, Any], digests: dict[str, str]) -> tuple[list[str], set[str]] | None:
    """After library files changed: ``(the test files to measure again, the changed files)``; None when the map must
    be made again whole (made before files had digests, or a library file was added or removed: who imports a new
    file is not known).

    A test file is measured again when it uses a changed file beyond importing it (``chosen_tests``'s rule), or when
    the file's import cannot be told from its use (every test file that runs it runs the same lines, and some test
    files do not run it). One that only imports a changed file runs its new module-level lines, and only those
    (``with_import_lines``): nothing it calls changed."""
    old = known.get("digests")
    if old is None or set(old) != set(digests):
        return None
    changed = {name for name, digest in digests.items() if old[name] != digest}
    tests = known["tests"]
    again: set[str] = set()
    for path in changed:
        ran, _imported, exercising = exercised(tests, path)
        if ran:
            again |= exercising or (set(ran) if len(ran) < len(tests) else set())
    return sorted(again), changed


def with_import_lines(known: dict[str, Any], changed: set[str], again: list[str],
                      imports: dict[str, str]) -> dict[str, Any]:
    """``known`` with each changed file's lines, for the test files not measured again, replaced by the lines its
    import runs now (``imports``); the test files measured again keep their old entries until they are."""
    for name, entry in known["tests"].items():
        if name in again:
            continue
        for path in changed & set(entry["files"]):
            if path in imports:
                entry["files"][path] = imports[path]
            else:
                del entry["files"][path]
    return known


def import_lines(files: set[str], root: Path = ROOT, bin_dir: Path = BIN) -> dict[str, str]:
    """The lines of each of ``files`` that importing it runs (its module-level statements), measured by coverage the
    way ``measure`` measures a test file."""
    import tempfile

    import coverage

    modules = sorted(name[: -len(".py")].removesuffix("/__init__").replace("/", ".") for name in files)
    with tempfile.TemporaryDirectory(prefix="cai-mpi-map-") as tmp:
        rc, script = Path(tmp) / "coveragerc", Path(tmp) / "imports.py"
        rc.write_text(f"[run]\nsource = cai_mpi\ndata_file = {tmp}/.coverage\n")
        script.write_text(f"import importlib\nfor name in {modules!r}:\n    importlib.import_module(name)\n")
        env = {**os.environ, "PYTHONPATH": str(root)}
        run_group([str(bin_dir / "python"), "-m", "coverage", "run", f"--rcfile={rc}", str(script)], MAP_TIMEOUT,
                  cwd=root, env=env)
        cov = coverage.Coverage(data_file=f"{tmp}/.coverage", config_file=str(rc))
        cov.load()
        data = cov.get_data()
        found = {library_file(measured, root): sorted(data.lines(measured) or []) for measured in data.measured_files()}
    return {name: ranges(found[name]) for name in sorted(files) if found.get(name)}


def write_map(known: dict[str, Any], root: Path = ROOT) -> None:
    """Write the map, stamped with the sources it now describes."""
    known["tests"] = {name: known["tests"][name] for name in sorted(known["tests"])}
    known.update(revision=revision(), library=library_digest(root), digests=file_digests(root), ranks=MAP_RANKS,
                 markers=MARKERS, made=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    STATE.mkdir(exist_ok=True)
    MAP.write_text(json.dumps(known, indent=1) + "\n")


def build_map(names: list[str] | None = None, known: dict[str, Any] | None = None) -> None:
    """Measure ``names`` (every test file when None) into ``known`` (a new map when None) and write the map; nothing
    is written before every one is measured, so an interrupted refresh is planned again from the old map."""
    known = known if known is not None else {"tests": {}}
    for name in test_files() if names is None else names:
        print(f"== measuring {name}", flush=True)
        entry = measure(name)
        print(f"   {entry['status']}, {entry['seconds']} s, {len(entry['files'])} library files", flush=True)
        known["tests"][name] = entry
    write_map(known)
    print(f"wrote {MAP.relative_to(ROOT)}")


def session_files(module: str) -> set[str]:
    """The library files ``module``'s session mutates, one by one."""
    out: set[str] = set()
    for name in MODULES[module]:
        path = ROOT / name
        out |= {str(p.relative_to(ROOT)) for p in path.rglob("*.py")} if path.is_dir() else {name}
    return out


def lines_of(text: str) -> set[int]:
    """The line numbers a map entry's ranges ("1-3,7") name."""
    out: set[int] = set()
    for part in text.split(","):
        first, _, end = part.partition("-")
        out.update(range(int(first), int(end or first) + 1))
    return out


def exercised(tests: dict[str, Any], path: str) -> tuple[dict[str, set[int]], set[int], set[str]]:
    """Of the map entries ``tests``, for library file ``path``: the lines each test file that runs it runs, the lines
    all of them run (its import: module-level statements), and the test files that run more than those (use it)."""
    ran = {name: lines_of(entry["files"][path]) for name, entry in tests.items() if path in entry["files"]}
    imported = set.intersection(*ran.values()) if ran else set()
    return ran, imported, {name for name, lines in ran.items() if lines - imported}


def chosen_tests(module: str, coverage_map: dict[str, Any], root: Path = ROOT,
                 mutated: tuple[str, int] | None = None) -> list[str]:
    """The test files that exercise ``module``'s files, the quickest first (a mutant most tests kill dies sooner).

    A test file exercises a library file when it executes a line of it beyond what every test file executing it
    executes (its import: module-level statements, which every test runs since tests/conftest.py imports the
    library). With ``mutated`` (the file and line a mutant changed), the test files that execute that line; for an
    import line, or a line no test executes (inside a statement that starts above it), those that exercise its
    file. Test files gone since the map was made are left out, and so are those that failed when the map measured
    them: a test file that fails on the library as it is cannot tell a mutant from it (every mutant would count as
    killed; ``failing_tests`` names them)."""
    tests = {name: entry for name, entry in coverage_map["tests"].items()
             if (root / name).is_file() and entry.get("status", "passed") == "passed"}
    files = session_files(module) if mutated is None else {mutated[0]}
    chosen: set[str] = set()
    for path in files:
        ran, imported, exercising = exercised(tests, path)
        if not ran:
            continue
        if mutated is None or mutated[1] in imported:
            chosen |= exercising
        else:
            chosen |= {name for name, lines in ran.items() if mutated[1] in lines} or exercising
    return sorted(chosen, key=lambda name: (tests[name]["seconds"], name))


def failing_tests(coverage_map: dict[str, Any]) -> list[str]:
    """The test files that did not pass when the map measured them (``chosen_tests`` leaves them out)."""
    return sorted(name for name, entry in coverage_map["tests"].items() if entry.get("status", "passed") != "passed")


def mutated_line(module: str, tree: Path) -> tuple[str, int] | None:
    """The first file and line where ``tree`` (cosmic-ray's scratch copy, a mutant applied) differs from ROOT."""
    if tree.resolve() == ROOT.resolve():
        return None
    for name in sorted(session_files(module)):
        mine, theirs = (tree / name).read_text().splitlines(), (ROOT / name).read_text().splitlines()
        for number, (a, b) in enumerate(zip(mine, theirs), start=1):
            if a != b:
                return name, number
        if len(mine) != len(theirs):
            return name, min(len(mine), len(theirs)) + 1
    return None


def stages(module: str, mutated: tuple[str, int] | None = None) -> list[list[str]]:
    """The test commands for ``module`` (for a mutant at ``mutated``), in order: the chosen test files outside
    tests/mpi (tests/unit and the top-level ones) in one process, then tests/mpi's under mpiexec at 2 and 3 ranks
    (``RANKS``)."""
    chosen = chosen_tests(module, json.loads(MAP.read_text()), mutated=mutated)
    one_process = [name for name in chosen if not name.startswith("tests/mpi/")]
    mpi = [name for name in chosen if name.startswith("tests/mpi/")]
    common = ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", f"--timeout={TEST_TIMEOUT}",
              "--timeout-method=thread", "-m", MARKERS]
    out = []
    if one_process:
        out.append([str(BIN / "python"), *common, *one_process])
    if mpi:
        for n in RANKS.get(module, (2, 3)):
            out.append([str(BIN / "mpiexec"), "-n", str(n), str(BIN / "python"), *common, "--with-mpi", *mpi])
    return out


def stale_tests(coverage_map: dict[str, Any], root: Path = ROOT) -> list[str]:
    """Test files the map has not measured as they are: new since it was made, or changed since they were measured
    (a new test may run lines the old entry does not list, and the harness would not choose it for a mutant there).
    An entry without a digest (a map from before they were kept) is measured again too."""
    tests = coverage_map["tests"]
    return [name for name in test_files(root)
            if name not in tests or tests[name].get("digest") != digest_of_test(root / name)]


def digest_of_test(path: Path) -> str:
    """A test file's digest, kept in its map entry: what tells the map the file changed since it was measured."""
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def test(module: str) -> int:
    """The per-mutant test command: exit 0 when every stage passes (the mutant survives)."""
    env = {**os.environ, "PYTHONPATH": str(Path.cwd()), "OMPI_ALLOW_RUN_AS_ROOT": "1",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    mutated = mutated_line(module, Path.cwd())
    commands = stages(module, mutated)
    print(f"mutant at {mutated}: {len(commands)} stage(s)" if mutated else f"{len(commands)} stage(s)", flush=True)
    for command in commands:
        try:
            run = run_group(command, STAGE_TIMEOUT, env=env)
        except subprocess.TimeoutExpired:
            print(f"stage timed out after {STAGE_TIMEOUT} s: {command[0].rsplit('/', 1)[-1]} with "
                  f"{sum(word.startswith('tests/') for word in command)} test file(s)")
            return 3
        if run.returncode != 0:
            files = [word for word in command if word.startswith("tests/")]
            print(f"stage failed (exit {run.returncode}), {command[0].rsplit('/', 1)[-1]} with {len(files)} test "
                  f"file(s); its last lines:")
            print("\n".join(run.stdout.splitlines()[-30:]))  # (last: what a saved state keeps is the tail)
            return 1
    return 0


def run_group(command: list[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in a process group of its own, its output captured; when it ends or runs past ``timeout``
    (``subprocess.TimeoutExpired``), whatever it left running in the group is killed: a test's own ``mpiexec``
    outlived its stage and busy-polled a core for an hour when only the stage's first process was killed. (Output
    goes to a file, not a pipe, which what is left running would hold open.)"""
    import tempfile

    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(command, start_new_session=True, stdout=out, stderr=subprocess.STDOUT, text=True,
                                **kwargs)
        try:
            proc.wait(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.seek(0)
        return subprocess.CompletedProcess(command, proc.returncode, out.read())


def revision() -> str:
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "cai_mpi", "tests"], cwd=ROOT, capture_output=True,
                           text=True).stdout
    return rev.strip() + ("+dirty" if dirty.strip() else "")


def scratch_tree(module: str) -> Path:
    """A copy of the tracked and new files, where cosmic-ray edits the module (the worktree is never touched)."""
    tree = STATE / f"tree-{module}"
    if tree.exists():
        shutil.rmtree(tree)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    for name in files:
        src = ROOT / name
        if src.is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tree / name)
    return tree


def config_text(module: str) -> str:
    paths = MODULES[module]
    command = f"{BIN / 'python'} {ROOT / 'scripts' / 'mutation.py'} test {module}"
    # cosmic-ray's own timeout is a last resort above the three stages' own limits
    return (f'[cosmic-ray]\nmodule-path = {json.dumps(paths)}\ntimeout = {4 * STAGE_TIMEOUT + 60}\n'
            f'excluded-modules = []\ntest-command = "{command}"\n\n[cosmic-ray.distributor]\nname = "local"\n')


def cosmic_ray(*args: str, cwd: Path) -> None:
    subprocess.run([str(BIN / "cosmic-ray"), *args], cwd=cwd, check=True)


def run(module: str, sample: int | None, seed: int, fresh: bool, retest_survivors: bool) -> None:
    STATE.mkdir(exist_ok=True)
    session, meta_path = STATE / f"{module}.sqlite", STATE / f"{module}.json"
    # A session goes on only over the sources it began with: its outcomes are for that code
    sources = module_digest(module)
    began = json.loads(meta_path.read_text()).get("sources") if meta_path.exists() else None
    if session.exists() and not fresh and began != sources:
        print(f"== {module}: its sources changed since this machine's session began: a new session (the saved "
              "state restores only what was tested on these sources)", flush=True)
    if fresh or began != sources or not session.exists():
        session.unlink(missing_ok=True)
        tree = scratch_tree(module)
        (tree / "mutation.toml").write_text(config_text(module))
        cosmic_ray("init", "mutation.toml", str(session), cwd=tree)
        skip_annotations(session, tree)
        if sample is not None:
            skip_all_but(session, sample, seed)
        meta_path.write_text(json.dumps({"revision": revision(), "sample": sample, "seed": seed, "sources": sources,
                                         "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}))
        if not fresh:
            print(f"== {module}: {restore_state(module, session)} mutants' outcomes restored from "
                  f"{SAVED.relative_to(ROOT)}", flush=True)
    else:
        scratch_tree(module)  # the tests as they are now (over the same module sources)
        (STATE / f"tree-{module}" / "mutation.toml").write_text(config_text(module))
        if sample is not None:
            grow_sample(session, sample, seed)
            meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
            meta["sample"] = max(sample, meta.get("sample") or 0)
            meta_path.write_text(json.dumps(meta))
    if retest_survivors and not fresh:  # (survivors of this session's runs, or restored from the saved state)
        forgotten = forget_survivors(session)
        print(f"== {module}: {forgotten} survivor(s) to test again", flush=True)
        if meta_path.exists():
            meta = json.loads(meta_path.read_text())
            meta["survivors_retested"] = f"{revision()} {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
            meta_path.write_text(json.dumps(meta))
    tree = STATE / f"tree-{module}"
    print(f"== {module}: mutating {', '.join(MODULES[module])} in {tree}", flush=True)
    cosmic_ray("exec", "mutation.toml", str(session), cwd=tree)


#: Every session's tested mutants and their outcomes, committed: a sample runs in parts, on machines that do not
#: keep .mutation/ (a new session's machine), and ``run`` goes on where the saved state ends (issue 45).
SAVED = ROOT / "docs" / "mutation-state.json"


def module_digest(module: str) -> str:
    """A digest of the files ``module``'s session mutates: a saved state is for these sources only."""
    import hashlib

    digest = hashlib.sha256()
    for name in sorted(session_files(module)):
        digest.update(name.encode() + b"\0" + (ROOT / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def where_key(file: str, operator: str, occurrence: int) -> str:
    """One mutant's name in the saved state: cosmic-ray's job ids are new at every init, this is not."""
    return f"{file}:{operator}:{occurrence}"


def saved_results(module: str) -> dict[str, dict[str, Any]]:
    """The saved outcomes of ``module``'s mutants, by ``where_key``, if they were made on today's sources."""
    saved = json.loads(SAVED.read_text()).get(module) if SAVED.exists() else None
    if not saved or saved.get("sources") != module_digest(module):
        return {}
    return dict(saved["results"])


def save_state(modules: list[str]) -> None:
    """Write the tested mutants of ``modules``' sessions into SAVED, keeping the other modules' entries."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome

    saved = json.loads(SAVED.read_text()) if SAVED.exists() else {}
    for module in modules:
        session, meta_path = STATE / f"{module}.sqlite", STATE / f"{module}.json"
        if not session.exists():
            continue
        results: dict[str, dict[str, Any]] = {}
        with use_db(str(session), WorkDB.Mode.open) as db:
            items = {item.job_id: item for item in db.work_items}
            for job, result in db.results:
                if result.worker_outcome == WorkerOutcome.SKIPPED:
                    continue  # (annotations and the sample's rest: drawn again from the seed)
                m = items[job].mutations[0]
                results[where_key(str(m.module_path), m.operator_name, m.occurrence)] = {
                    "worker": result.worker_outcome.value,
                    "test": None if result.test_outcome is None else result.test_outcome.value,
                    "output": (result.output or "")[-1500:], "diff": result.diff}
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        saved[module] = {**meta, "sources": module_digest(module), "saved": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                          time.gmtime()),
                         "results": dict(sorted(results.items()))}
    SAVED.write_text(json.dumps(dict(sorted(saved.items())), indent=1) + "\n")


def restore_state(module: str, session: Path) -> int:
    """Record in a new session the outcomes saved for its mutants (same sources); how many were restored."""
    from cosmic_ray.work_db import use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    saved = saved_results(module)
    if not saved:
        return 0
    restored = 0
    with use_db(str(session)) as db:
        done = {job for job, result in db.results if result.output != "not in the sample"}
        for item in db.work_items:
            m = item.mutations[0]
            entry = saved.get(where_key(str(m.module_path), m.operator_name, m.occurrence))
            if entry is None or item.job_id in done:
                continue
            db.set_result(item.job_id, WorkResult(
                worker_outcome=WorkerOutcome(entry["worker"]), output=entry["output"], diff=entry["diff"],
                test_outcome=None if entry["test"] is None else TestOutcome(entry["test"])))
            restored += 1
    return restored


ANNOTATION = "equivalent: inside a type annotation (never evaluated: from __future__ import annotations)"


def annotation_spans(path: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Where ``path``'s annotations are, as ((line, col), (end line, end col))."""
    spans = []
    for node in ast.walk(ast.parse(path.read_text())):
        notes = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            notes.append(node.returns)
        if isinstance(node, ast.arg) and node.annotation is not None:
            notes.append(node.annotation)
        if isinstance(node, ast.AnnAssign):
            notes.append(node.annotation)
        spans += [((n.lineno, n.col_offset), (n.end_lineno or n.lineno, n.end_col_offset or 0)) for n in notes]
    return spans


def skip_annotations(session: Path, tree: Path) -> None:
    """Mutants inside annotations are equivalent in modules that postpone their evaluation: record them as such."""
    from cosmic_ray.work_db import use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(session)) as db:
        spans: dict[str, list[tuple[tuple[int, int], tuple[int, int]]]] = {}
        equivalent = []
        for item in db.work_items:
            m = item.mutations[0]
            path = tree / m.module_path
            if "from __future__ import annotations" not in path.read_text():
                continue
            where = spans.setdefault(str(path), annotation_spans(path))
            if any(start <= tuple(m.start_pos) < end for start, end in where):
                equivalent.append(item.job_id)
        if equivalent:
            db.set_multiple_results(equivalent, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output=ANNOTATION))


def forget_survivors(session: Path) -> int:
    """Make the survivors pending again, to see whether the tests written since kill them; how many there were."""
    import sqlite3

    with sqlite3.connect(session) as db:
        return db.execute("DELETE FROM work_results WHERE upper(test_outcome) = 'SURVIVED'").rowcount


def skip_all_but(session: Path, sample: int, seed: int) -> None:
    """Keep ``sample`` mutants, drawn with ``seed``; record the rest as skipped so ``exec`` leaves them alone."""
    from cosmic_ray.work_db import use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(session)) as db:
        done = {job for job, _ in db.results}
        # Drawn from the mutants in a stable order (file, operator, occurrence): cosmic-ray's job ids are new random
        # UUIDs at every init, so a draw over them could not be repeated from the seed.
        items = sorted((item for item in db.work_items if item.job_id not in done), key=_where)
        ids = [item.job_id for item in items]
        keep = set(random.Random(seed).sample(ids, min(sample, len(ids))))
        skipped = [job for job in ids if job not in keep]
        if skipped:
            db.set_multiple_results(skipped, WorkResult(worker_outcome=WorkerOutcome.SKIPPED,
                                                        output="not in the sample"))


def _where(item: Any) -> tuple[str, str, int, tuple[int, int]]:
    m = item.mutations[0]
    return str(m.module_path), m.operator_name, m.occurrence, tuple(m.start_pos)


def grow_sample(session: Path, sample: int, seed: int) -> None:
    """Raise a sampled session's sample to ``sample`` mutants: more of the skipped ones become pending (drawn in the
    same stable order as ``skip_all_but``)."""
    import sqlite3

    from cosmic_ray.work_db import use_db

    with use_db(str(session)) as db:
        results = list(db.results)
        skipped_ids = {job for job, result in results if result.output == "not in the sample"}
        equivalent = sum(result.output == ANNOTATION for _, result in results)
        items = sorted(db.work_items, key=_where)
    skipped = [item.job_id for item in items if item.job_id in skipped_ids]
    more = sample - (len(items) - len(skipped) - equivalent)
    if more > 0:
        chosen = random.Random(seed + sample).sample(skipped, min(more, len(skipped)))
        with sqlite3.connect(session) as conn:
            conn.executemany("DELETE FROM work_results WHERE job_id = ?", [(job,) for job in chosen])


def score(module: str) -> dict[str, Any] | None:
    """Killed, timed out, survived, incompetent (the mutant does not import), pending, skipped; and the survivors."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    session = STATE / f"{module}.sqlite"
    if not session.exists():
        return None
    names = ("killed", "timeout", "survived", "judged_equivalent", "incompetent", "equivalent", "pending", "skipped")
    counts = dict.fromkeys(names, 0)
    survivors = []
    with use_db(str(session), WorkDB.Mode.open) as db:
        done = dict(db.results)
        for item in db.work_items:
            result = done.get(item.job_id)
            if result is None:
                counts["pending"] += 1
            elif result.worker_outcome == WorkerOutcome.SKIPPED:
                counts["equivalent" if result.output == ANNOTATION else "skipped"] += 1
            elif result.test_outcome == TestOutcome.INCOMPETENT or result.worker_outcome != WorkerOutcome.NORMAL:
                counts["incompetent"] += 1
            elif result.test_outcome == TestOutcome.SURVIVED:
                m = item.mutations[0]
                why = JUDGED_EQUIVALENT.get((str(m.module_path), m.operator_name, m.occurrence))
                counts["survived" if why is None else "judged_equivalent"] += 1
                survivors.append({"job": item.job_id, "file": str(m.module_path), "operator": m.operator_name,
                                  "occurrence": m.occurrence, "line": m.start_pos[0], "equivalent": why,
                                  "diff": result.diff})
            elif result.output == "timeout" or "stage timed out" in (result.output or ""):
                counts["timeout"] += 1
            else:
                counts["killed"] += 1
    meta_path = STATE / f"{module}.json"
    tested = counts["killed"] + counts["timeout"] + counts["survived"]
    return {"module": module, **(json.loads(meta_path.read_text()) if meta_path.exists() else {}), **counts,
            "killed_pct": round(100 * (counts["killed"] + counts["timeout"]) / tested, 1) if tested else None,
            "survivors": survivors}


def report(modules: list[str], json_path: Path | None, markdown: bool = False) -> None:
    rows = [row for row in map(score, modules) if row is not None]
    print(f"{'module':<12} {'killed':>6} {'timeout':>7} {'survived':>8} {'judged eq.':>10} {'incomp.':>7} "
          f"{'equiv.':>6} {'pending':>7} {'skipped':>7} {'killed %':>8}  revision")
    for r in rows:
        pct = "-" if r["killed_pct"] is None else f"{r['killed_pct']:.1f}"
        print(f"{r['module']:<12} {r['killed']:>6} {r['timeout']:>7} {r['survived']:>8} {r['judged_equivalent']:>10} "
              f"{r['incompetent']:>7} "
              f"{r['equivalent']:>6} {r['pending']:>7} {r['skipped']:>7} {pct:>8}  {r.get('revision', '?')}"
              f"{' (sample of ' + str(r['sample']) + ')' if r.get('sample') else ''}")
    for r in rows:
        for s in r["survivors"]:
            print(f"\n-- survivor {r['module']}: {s['file']}:{s['line']} {s['operator']} #{s['occurrence']}"
                  + (f" (judged equivalent: {s['equivalent']})" if s["equivalent"] else ""))
            print(s["diff"] or "")
    if markdown:
        print("\n| Module | Mutants | Annotations (equiv.) | Tested | Killed | Timeout | Survived | Judged equivalent "
              "| Killed % of non-equivalent |\n|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            total = sum(r[k] for k in ("killed", "timeout", "survived", "judged_equivalent", "incompetent",
                                       "equivalent", "pending", "skipped"))
            tested = r["killed"] + r["timeout"] + r["survived"] + r["judged_equivalent"]
            pct = "-" if r["killed_pct"] is None else f"{r['killed_pct']:.0f}%"
            scope = "all" if not (r["skipped"] or r["pending"]) else "sample"
            print(f"| {r['module']} | {total} | {r['equivalent']} | {tested} ({scope}) | {r['killed']} "
                  f"| {r['timeout']} | {r['survived']} | {r['judged_equivalent']} | {pct} |")
    if json_path:
        json_path.write_text(json.dumps(rows, indent=2))
        print(f"\nwrote {json_path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="mutate and test (resumable)")
    p_run.add_argument("modules", nargs="*", choices=[[], *MODULES], metavar="MODULE")
    p_run.add_argument("--sample", type=int,
                       help="test only N mutants per module, drawn at random (on a sampled session: raise it to N)")
    p_run.add_argument("--seed", type=int, default=28)
    p_run.add_argument("--fresh", action="store_true", help="discard the module's session and start over")
    p_run.add_argument("--retest-survivors", action="store_true",
                       help="run the survivors again against the current tests (same module source)")
    p_rep = sub.add_parser("report", help="the score per module")
    p_rep.add_argument("modules", nargs="*", metavar="MODULE")
    p_rep.add_argument("--json", type=Path, help="also write the scores and survivors as JSON")
    p_rep.add_argument("--markdown", action="store_true", help="also print the table for docs/testing.md")
    p_map = sub.add_parser("map", help="measure which library files each test file executes (the coverage map)")
    p_map.add_argument("tests", nargs="*", metavar="TEST_FILE", help="only these (default: every test file)")
    p_test = sub.add_parser("test", help="the test command cosmic-ray runs for each mutant of MODULE")
    p_test.add_argument("module", choices=list(MODULES))
    args = parser.parse_args()
    if args.command == "test":
        return test(args.module)
    if args.command == "map":
        build_map(args.tests or None, json.loads(MAP.read_text()) if args.tests and MAP.exists() else None)
        return 0
    modules = args.modules or list(MODULES)
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {unknown}: choose from {list(MODULES)}")
    if args.command == "run":
        failing = failing_tests(current_map())  # (made before the first scratch tree: every session's mutants use it)
        if failing:
            print(f"== left out of every mutant's tests, since they fail on the library as it is: {failing}",
                  flush=True)
        try:
            for module in modules:
                run(module, args.sample, args.seed, args.fresh, args.retest_survivors)
        finally:  # (an interrupted run keeps what it tested: commit docs/mutation-state.json, go on elsewhere)
            save_state(modules)
        report(modules, None)
    else:
        report(modules, args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
