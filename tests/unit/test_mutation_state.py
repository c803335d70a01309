"""scripts/mutation.py's saved state (docs/mutation-state.json, issue 45): a sample runs in parts, in sessions on
machines that do not keep .mutation/, so each module's tested mutants are saved under a digest of its sources and
restored into the next session's fresh cosmic-ray database. A saved state round-trips: what a module's session
tested comes back into a new session of the same sources (cosmic-ray's job ids are new at every init: mutants are
matched by file, operator and occurrence); a changed source restores nothing; mutants skipped (outside the sample,
inside annotations) are not saved, since the seed draws them again.

The script runs against a tree of its own under ``tmp_path`` (its ``ROOT``, ``SAVED``, ``STATE`` and ``MODULES``
pointed there), never the repository's docs/mutation-state.json. cosmic-ray is not in the test venvs (it is the
mutation venv's, docs/testing.md): the sessions are kept by a stand-in with the few names of cosmic-ray's
``work_db`` and ``work_item`` that the script uses, and by cosmic-ray itself where it imports (``.venv-mut``), which
checks the stand-in against the real thing."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import importlib.util
import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.one_wheel

LIB = "cai_mpi/_src/m.py"  # the module "m" the sessions mutate
OTHER = "cai_mpi/_src/other.py"  # another module's file, with a saved state of its own


def stand_in() -> dict[str, types.ModuleType]:
    """``cosmic_ray``, ``cosmic_ray.work_db`` and ``cosmic_ray.work_item`` with what scripts/mutation.py and these
    tests use of them, the sessions kept in memory (a file at the session's path says it exists)."""

    class WorkerOutcome(str, enum.Enum):
        NORMAL = "normal"
        EXCEPTION = "exception"
        ABNORMAL = "abnormal"
        NO_TEST = "no-test"
        SKIPPED = "skipped"

    class TestOutcome(str, enum.Enum):
        SURVIVED = "survived"
        KILLED = "killed"
        INCOMPETENT = "incompetent"

    @dataclasses.dataclass(frozen=True)
    class WorkResult:
        worker_outcome: WorkerOutcome
        output: str | None = None
        test_outcome: TestOutcome | None = None
        diff: str | None = None

    @dataclasses.dataclass(frozen=True)
    class MutationSpec:
        module_path: Path
        operator_name: str
        occurrence: int
        start_pos: tuple[int, int]
        end_pos: tuple[int, int]

        def __post_init__(self) -> None:
            object.__setattr__(self, "module_path", Path(self.module_path))

    @dataclasses.dataclass(frozen=True)
    class WorkItem:
        job_id: str
        mutations: tuple[MutationSpec, ...]

        @classmethod
        def single(cls, job_id: str, mutation: MutationSpec) -> WorkItem:
            return cls(job_id, (mutation,))

    sessions: dict[str, tuple[dict[str, WorkItem], dict[str, WorkResult]]] = {}

    class WorkDB:
        class Mode(enum.Enum):
            create = 1
            open = 2

        def __init__(self, path: str, mode: WorkDB.Mode) -> None:
            if mode is WorkDB.Mode.open and not Path(path).exists():
                raise FileNotFoundError(path)
            self.path = path
            self.items, self.done = sessions.setdefault(path, ({}, {}))

        @property
        def work_items(self) -> list[WorkItem]:
            return list(self.items.values())

        @property
        def results(self) -> list[tuple[str, WorkResult]]:
            return list(self.done.items())

        def add_work_item(self, item: WorkItem) -> None:
            self.items[item.job_id] = item

        def set_result(self, job_id: str, result: WorkResult) -> None:
            if job_id not in self.items:
                raise KeyError(job_id)
            self.done[job_id] = result

        def close(self) -> None:
            Path(self.path).touch()

    @contextlib.contextmanager
    def use_db(path: str, mode: WorkDB.Mode = WorkDB.Mode.create) -> Iterator[WorkDB]:
        db = WorkDB(path, mode)
        try:
            yield db
        finally:
            db.close()

    work_item = types.ModuleType("cosmic_ray.work_item")
    for name, value in {"WorkerOutcome": WorkerOutcome, "TestOutcome": TestOutcome, "WorkResult": WorkResult,
                        "MutationSpec": MutationSpec, "WorkItem": WorkItem}.items():
        setattr(work_item, name, value)
    work_db = types.ModuleType("cosmic_ray.work_db")
    work_db.WorkDB, work_db.use_db = WorkDB, use_db  # type: ignore[attr-defined]
    package = types.ModuleType("cosmic_ray")
    package.work_db, package.work_item = work_db, work_item  # type: ignore[attr-defined]
    return {"cosmic_ray": package, "cosmic_ray.work_db": work_db, "cosmic_ray.work_item": work_item}


@pytest.fixture(params=["stand-in", "cosmic-ray"])
def cr(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """cosmic-ray's ``work_db`` and ``work_item``: the stand-in (always), or cosmic-ray itself where it imports."""
    if request.param == "cosmic-ray":
        work_db = pytest.importorskip("cosmic_ray.work_db", reason="cosmic-ray is only in the mutation venv")
        import cosmic_ray.work_item as work_item
    else:
        modules = stand_in()
        for name, module in modules.items():
            monkeypatch.setitem(sys.modules, name, module)
        work_db, work_item = modules["cosmic_ray.work_db"], modules["cosmic_ray.work_item"]
    return types.SimpleNamespace(work_db=work_db, work_item=work_item)


@pytest.fixture
def script(tmp_path: Path) -> Any:
    """scripts/mutation.py, loaded afresh, working on a tree under ``tmp_path``: two modules of one file each."""
    spec = importlib.util.spec_from_file_location("mutation_script_state", ROOT / "scripts" / "mutation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, text in ((LIB, "def f(a, b):\n    return a + b\n"), (OTHER, "X = 1\n")):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    module.ROOT, module.STATE, module.SAVED = tmp_path, tmp_path / ".mutation", tmp_path / "docs" / "state.json"
    module.MODULES = {"m": [LIB], "other": [OTHER]}
    module.STATE.mkdir()
    module.SAVED.parent.mkdir()
    return module


Where = tuple[str, str, int]  # (file, operator, occurrence): a mutant's name across sessions


def new_session(cr: types.SimpleNamespace, path: Path, outcomes: dict[Where, Any], jobs: str) -> None:
    """A session at ``path`` with one work item per mutant in ``outcomes`` (job ids from ``jobs``, new at every
    init as cosmic-ray's are), and the results that are not None."""
    wi = cr.work_item
    with cr.work_db.use_db(str(path)) as db:
        for i, ((file, operator, occurrence), result) in enumerate(outcomes.items()):
            job = f"{jobs}-{i}"
            db.add_work_item(wi.WorkItem.single(job, wi.MutationSpec(file, operator, occurrence, (1, 0), (1, 1))))
            if result is not None:
                db.set_result(job, result)


def results_of(cr: types.SimpleNamespace, path: Path) -> dict[Where, tuple[str, str | None, str | None, str | None]]:
    """The session's results by mutant: (worker outcome, test outcome, output, diff)."""
    with cr.work_db.use_db(str(path), cr.work_db.WorkDB.Mode.open) as db:
        items = {item.job_id: item.mutations[0] for item in db.work_items}
        return {(str(items[job].module_path), items[job].operator_name, items[job].occurrence):
                (r.worker_outcome.value, None if r.test_outcome is None else r.test_outcome.value, r.output, r.diff)
                for job, r in db.results}


KILLED: Where = (LIB, "core/ReplaceBinaryOperator_Add_Sub", 0)
SURVIVED: Where = (LIB, "core/ReplaceBinaryOperator_Add_Mul", 0)
TIMED_OUT: Where = (LIB, "core/ReplaceBinaryOperator_Add_Div", 0)
OUTSIDE: Where = (LIB, "core/ReplaceBinaryOperator_Add_Mod", 0)  # skipped: not in the sample
ANNOTATION: Where = (LIB, "core/NumberReplacer", 0)  # skipped: inside an annotation
PENDING: Where = (LIB, "core/ReplaceBinaryOperator_Add_Pow", 0)  # in the sample, not run yet


def part_tested_session(cr: types.SimpleNamespace, path: Path) -> dict[Where, Any]:
    """A session of module ``m`` part-way through its sample; what it holds, by mutant."""
    wi = cr.work_item
    w, t = wi.WorkerOutcome, wi.TestOutcome
    outcomes = {
        KILLED: wi.WorkResult(w.NORMAL, "FAILED test_add", t.KILLED, "- a + b\n+ a - b"),
        SURVIVED: wi.WorkResult(w.NORMAL, "1 passed", t.SURVIVED, "- a + b\n+ a * b"),
        TIMED_OUT: wi.WorkResult(w.ABNORMAL, "timeout", None, "- a + b\n+ a / b"),
        OUTSIDE: wi.WorkResult(w.SKIPPED, "not in the sample"),
        ANNOTATION: wi.WorkResult(w.SKIPPED, "equivalent: inside a type annotation"),
        PENDING: None,
    }
    new_session(cr, path, outcomes, "first")
    return outcomes


def test_a_saved_state_is_restored_into_a_fresh_session_of_the_same_sources(
    script: Any, cr: types.SimpleNamespace
) -> None:
    script.SAVED.write_text(json.dumps({"other": {"sources": script.module_digest("other"), "results": {}}}))
    part_tested_session(cr, script.STATE / "m.sqlite")
    before = results_of(cr, script.STATE / "m.sqlite")
    script.save_state(["m"])

    saved = json.loads(script.SAVED.read_text())
    assert set(saved) == {"m", "other"}, "another module's saved state is kept"
    assert saved["m"]["sources"] == script.module_digest("m")
    assert set(saved["m"]["results"]) == {script.where_key(*w) for w in (KILLED, SURVIVED, TIMED_OUT)}

    # the next session, elsewhere: a new database with new job ids, the sample's rest skipped again by the seed (a
    # smaller sample there leaves SURVIVED out: what was tested comes back all the same)
    fresh = script.STATE / "m-next.sqlite"
    wi = cr.work_item
    outside = wi.WorkResult(wi.WorkerOutcome.SKIPPED, "not in the sample")
    new_session(cr, fresh, {KILLED: None, SURVIVED: outside, TIMED_OUT: None, PENDING: None, OUTSIDE: outside},
                "second")
    assert script.restore_state("m", fresh) == 3
    after = results_of(cr, fresh)
    assert {w: after[w] for w in (KILLED, SURVIVED, TIMED_OUT)} == {w: before[w] for w in (KILLED, SURVIVED, TIMED_OUT)}
    assert PENDING not in after, "a mutant never run stays pending"
    assert after[OUTSIDE] == ("skipped", None, "not in the sample", None)


def test_skipped_mutants_are_not_saved(script: Any, cr: types.SimpleNamespace) -> None:
    """Outside the sample or inside an annotation: the seed and the annotation pass decide them again, and a
    mutant skipped in one part may be drawn when the sample grows."""
    part_tested_session(cr, script.STATE / "m.sqlite")
    script.save_state(["m"])
    kept = script.saved_results("m")
    assert script.where_key(*OUTSIDE) not in kept and script.where_key(*ANNOTATION) not in kept
    assert script.where_key(*PENDING) not in kept
    assert {entry["worker"] for entry in kept.values()} == {"normal", "abnormal"}


def test_a_changed_source_restores_nothing(script: Any, cr: types.SimpleNamespace) -> None:
    part_tested_session(cr, script.STATE / "m.sqlite")
    script.save_state(["m"])
    digest = script.module_digest("m")
    (script.ROOT / OTHER).write_text("X = 2\n")  # another module's file: not this module's sources
    assert script.module_digest("m") == digest and len(script.saved_results("m")) == 3

    (script.ROOT / LIB).write_text("def f(a, b):\n    return a - b\n")  # the same mutants by name, other code
    assert script.module_digest("m") != digest
    assert script.saved_results("m") == {}
    fresh = script.STATE / "m-next.sqlite"
    new_session(cr, fresh, {KILLED: None, SURVIVED: None, TIMED_OUT: None}, "second")
    assert script.restore_state("m", fresh) == 0
    assert results_of(cr, fresh) == {}


def test_nothing_saved_restores_nothing(script: Any, cr: types.SimpleNamespace) -> None:
    """No saved state yet (a first run), or none for this module: the session starts empty."""
    fresh = script.STATE / "m.sqlite"
    new_session(cr, fresh, {KILLED: None}, "first")
    assert script.saved_results("m") == {} and script.restore_state("m", fresh) == 0
    script.SAVED.write_text(json.dumps({"other": {"sources": script.module_digest("other"), "results": {}}}))
    assert script.saved_results("m") == {} and script.restore_state("m", fresh) == 0


def stub_cosmic_ray(script: Any, cosmic_ray: Any) -> None:
    """``run`` with cosmic-ray's commands replaced by ``cosmic_ray`` and the session's preparation made a no-op."""
    script.cosmic_ray = cosmic_ray
    script.scratch_tree = lambda module: script.STATE / f"tree-{module}"
    (script.STATE / "tree-m").mkdir()
    script.skip_annotations = lambda session, tree: None
    script.skip_all_but = lambda session, sample, seed: None
    script.grow_sample = lambda session, sample, seed: None


@pytest.mark.parametrize("existing", [False, True], ids=["restored", "existing"])
def test_survivors_are_tested_again_whether_restored_or_found_in_the_session(script: Any, existing: bool) -> None:
    """``run --retest-survivors`` makes every survivor pending again before cosmic-ray runs: those of a session on
    this machine, and those a new session restored from the saved state (a new machine's first run)."""
    calls: list[str] = []
    session = script.STATE / "m.sqlite"
    if existing:
        session.touch()
        (script.STATE / "m.json").write_text(json.dumps({"sources": script.module_digest("m")}))

    def cosmic_ray(*args: str, cwd: Path) -> None:
        calls.append(args[0])
        if args[0] == "init":
            session.touch()

    stub_cosmic_ray(script, cosmic_ray)
    script.restore_state = lambda module, session: calls.append("restore") or 1
    script.forget_survivors = lambda session: calls.append("forget") or 1
    script.run("m", 8, 45, False, True)
    assert calls == (["forget", "exec"] if existing else ["init", "restore", "forget", "exec"])


@pytest.mark.parametrize("changed", [False, True], ids=["same sources", "changed sources"])
def test_a_session_goes_on_only_over_the_sources_it_began_with(script: Any, changed: bool) -> None:
    """``run`` without ``--fresh`` resumes this machine's session of a module; after the module's sources changed, its
    outcomes are for other code, so a new session begins (and the saved state restores only what was tested on the
    sources as they are)."""
    calls: list[str] = []
    session = script.STATE / "m.sqlite"
    session.touch()
    (script.STATE / "m.json").write_text(json.dumps({"sources": script.module_digest("m")}))
    if changed:
        (script.ROOT / LIB).write_text("def f(a, b):\n    return a - b\n")

    def cosmic_ray(*args: str, cwd: Path) -> None:
        calls.append(args[0])

    stub_cosmic_ray(script, cosmic_ray)
    script.restore_state = lambda module, session: calls.append("restore") or 0
    script.run("m", 8, 45, False, False)
    assert calls == (["init", "restore", "exec"] if changed else ["exec"])
    assert json.loads((script.STATE / "m.json").read_text())["sources"] == script.module_digest("m")

