"""Submit slurm/cai_mpi.sbatch, unchanged, to a real Slurm for every launcher and GPU binding.

The cluster (tests/slurm/conftest.py) has two emulated nodes with two fake GPUs each; the jobs run
4 ranks on 2 nodes (two run 2 ranks on one node, with `sbatch --nodes=1`). Only documented variables
change between submissions: CAI_MPI_VENV (the venvs the test runner made: CAI_MPI_VENV_OPENMPI,
CAI_MPI_VENV_MPICH; else this interpreter's prefix if its mpi4py uses that MPI), CAI_MPI_LAUNCHER,
CAI_MPI_GPU_BIND, CAI_MPI_SRUN_MPI, and the program (slurm/job_check.py); the `readme` cases set none of them and
submit from a directory whose .venv is the venv, as the README's set-up leaves it. All jobs are submitted at
once, Slurm runs them one after another, and each test then reads its job's log.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SLURM_DIR = REPO / "slurm"
TEMPLATE = SLURM_DIR / "cai_mpi.sbatch"
JOB_CHECK = SLURM_DIR / "job_check.py"
FAILING_RANK = Path(__file__).resolve().parent / "failing_rank.py"
NODES, GPUS_PER_NODE = ("n1", "n2"), 2  # the cluster; the template asks for 2 ranks per node
JOBS_TIMEOUT = 200  # seconds for all jobs together; the whole Slurm part must stay under 5 minutes
# The first test also pays for starting the cluster (conftest waits up to 125 s for its daemons) and for
# submitting every job: its time limit must cover that, or a slow start-up reads as a hang of the test.
STARTUP_ALLOWANCE = 180
pytestmark = [pytest.mark.slurm, pytest.mark.timeout(STARTUP_ALLOWANCE + JOBS_TIMEOUT + 60)]

# Running as root (CI) needs Open MPI's consent; a site never sets these.
ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {}


@dataclass(frozen=True)
class Case:
    name: str
    mpi: str  # which venv: "openmpi" or "mpich"
    launcher: str
    bind: str
    expect: str = "pass"  # pass | refused | mislaunch | rank fails
    srun_mpi: str = ""
    program: tuple[str, ...] = (str(JOB_CHECK),)
    mpi_env: dict[str, str] = field(default_factory=dict)  # what job_check must see on every rank
    nodes: int = 2  # 1: submitted with `sbatch --nodes=1` (command-line options override #SBATCH)
    cpu: bool = False  # submitted with `sbatch --gpus-per-node=0`: CPU nodes, CAI_MPI_GPU_BIND left to its default
    preflight: str = ""  # CAI_MPI_PREFLIGHT, when set
    # True: submitted as a README user does, from a directory whose .venv is the venv, with no CAI_MPI_* variable
    # set (the template finds the venv, detects `launcher` and defaults `bind`)
    readme: bool = False

    @property
    def ranks(self) -> int:
        return self.nodes * GPUS_PER_NODE

    @property
    def options(self) -> tuple[str, ...]:
        return (() if self.nodes == 2 else (f"--nodes={self.nodes}",)) + (("--gpus-per-node=0",) if self.cpu else ())

    def env(self, venv: str) -> dict[str, str]:
        if self.readme:
            return dict(ROOT_ENV)
        env = {
            "CAI_MPI_VENV": venv,
            "CAI_MPI_LAUNCHER": self.launcher,
            **ROOT_ENV,
        }
        if not (self.cpu and self.bind == "none"):  # (on CPU nodes, the default binding is none)
            env["CAI_MPI_GPU_BIND"] = self.bind
        if self.srun_mpi:
            env["CAI_MPI_SRUN_MPI"] = self.srun_mpi
        if self.preflight:
            env["CAI_MPI_PREFLIGHT"] = self.preflight
        return env


CASES = [
    Case("srun-pmix/per-task", "openmpi", "srun-pmix", "per-task"),
    Case("srun-pmix/all", "openmpi", "srun-pmix", "all"),
    Case("srun-pmi2/per-task", "mpich", "srun-pmi2", "per-task", mpi_env={"MPIR_CVAR_ENABLE_GPU": "1"}),
    Case("srun-pmi2/all", "mpich", "srun-pmi2", "all", mpi_env={"MPIR_CVAR_ENABLE_GPU": "1"}),
    Case("mpirun-openmpi/all", "openmpi", "mpirun", "all"),
    Case("mpirun-mpich/all", "mpich", "mpirun", "all"),
    # No Cray PMI here: the Cray variant runs MPICH through PMI-2 (its documented CAI_MPI_SRUN_MPI switch),
    # which checks everything but the site's cray_shasta plugin and Cray MPICH itself.
    Case("cray/all", "mpich", "cray", "all", srun_mpi="pmi2", mpi_env={"MPICH_GPU_SUPPORT_ENABLED": "1"}),
    Case(
        "cray/per-task",
        "mpich",
        "cray",
        "per-task",
        srun_mpi="pmi2",
        mpi_env={"MPICH_GPU_SUPPORT_ENABLED": "1", "MPICH_GPU_IPC_ENABLED": "0"},
    ),
    # The template's default program: the README's demo.
    Case("srun-pmi2/demo", "mpich", "srun-pmi2", "per-task", program=()),
    # srun without the MPI's PMI starts 4 singletons: the template must fail loudly before the program.
    Case("mislaunch", "mpich", "srun-pmi2", "per-task", expect="mislaunch", srun_mpi="none"),
    Case("mpirun/per-task", "openmpi", "mpirun", "per-task", expect="refused"),
    # A rank raises while the others wait for it: the job ends at once, with its traceback.
    Case("rank-fails/srun-pmix", "openmpi", "srun-pmix", "per-task", expect="rank fails", program=(str(FAILING_RANK),)),
    Case("rank-fails/srun-pmi2", "mpich", "srun-pmi2", "per-task", expect="rank fails", program=(str(FAILING_RANK),)),
    # CPU nodes: the template's one GPU request overridden (`sbatch --gpus-per-node=0`); the binding becomes none.
    Case("cpu-nodes/srun-pmi2", "mpich", "srun-pmi2", "none", cpu=True),
    Case("cpu-nodes/mpirun-openmpi", "openmpi", "mpirun", "none", cpu=True),
    Case("cpu-nodes/per-task", "mpich", "srun-pmi2", "per-task", expect="refused", cpu=True),
    # A production job skips the two preflight steps.
    Case("no-preflight/srun-pmi2", "mpich", "srun-pmi2", "per-task", preflight="0"),
    # Nothing set, submitted from the README's clone (issue 46): the template finds .venv and picks the launcher.
    Case("readme/mpich", "mpich", "srun-pmi2", "per-task", mpi_env={"MPIR_CVAR_ENABLE_GPU": "1"}, readme=True),
    Case("readme/openmpi", "openmpi", "srun-pmix", "per-task", readme=True),
    # One node: the same template with `sbatch --nodes=1`.
    Case("one-node/srun-pmix/per-task", "openmpi", "srun-pmix", "per-task", nodes=1),
    Case("one-node/srun-pmi2/all", "mpich", "srun-pmi2", "all", nodes=1),
]


# ---------------------------------------------------------------------------------------------------------
# venvs


def _mpi_family(python: str) -> str:
    """'openmpi', 'mpich' or a description of what this interpreter's mpi4py uses."""
    code = "import mpi4py; mpi4py.rc.initialize = False\nfrom mpi4py import MPI; print(MPI.Get_library_version())"
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return "unknown (mpi4py import timed out)"
    if proc.returncode != 0:
        return f"no usable mpi4py ({proc.stderr.strip().splitlines()[-1:] or proc.returncode})"
    version = proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else "?"
    if "Open MPI" in version:
        return "openmpi"
    if version.startswith("MPICH"):
        return "mpich"
    return version


@pytest.fixture(scope="session")
def venvs() -> dict[str, str]:
    """family -> venv directory, or family -> 'SKIP: reason'."""
    found = {}
    here = None
    for family in ("openmpi", "mpich"):
        var = f"CAI_MPI_VENV_{family.upper()}"
        if os.environ.get(var):
            venv = os.environ[var]
            assert Path(venv, "bin", "python").exists(), f"{var}={venv} has no bin/python"
            found[family] = venv
            continue
        here = here or _mpi_family(sys.executable)
        if here == family:
            found[family] = sys.prefix
        else:
            found[family] = f"SKIP: {var} is unset and this interpreter's mpi4py ({sys.prefix}) uses {here}"
    return found


# ---------------------------------------------------------------------------------------------------------
# all jobs at once


@dataclass
class Submitted:
    case: Case
    job_id: str | None = None
    skip: str | None = None
    result: Any = None  # conftest.JobResult


@pytest.fixture(scope="module")
def jobs(slurm_cluster: Any, venvs: dict[str, str]) -> Iterator[dict[str, Submitted]]:
    started = time.monotonic()
    submitted: dict[str, Submitted] = {}
    for case in CASES:
        venv = venvs[case.mpi]
        if venv.startswith("SKIP: "):
            submitted[case.name] = Submitted(case, skip=venv.removeprefix("SKIP: "))
            continue
        if case.launcher == "mpirun" and not Path(venv, "bin", "mpirun").exists():
            submitted[case.name] = Submitted(case, skip=f"{venv}/bin/mpirun missing (the MPI wheel ships it)")
            continue
        cwd = slurm_cluster.root / "jobs" / case.name.replace("/", "-")
        if case.readme:
            cwd.mkdir(parents=True, exist_ok=True)
            (cwd / ".venv").unlink(missing_ok=True)
            (cwd / ".venv").symlink_to(venv, target_is_directory=True)
        job_id = slurm_cluster.submit(TEMPLATE, case.program, env=case.env(venv), cwd=cwd, options=case.options)
        submitted[case.name] = Submitted(case, job_id=job_id)
    ids = [s.job_id for s in submitted.values() if s.job_id]
    results = slurm_cluster.wait(ids, timeout=JOBS_TIMEOUT)
    for s in submitted.values():
        if s.job_id:
            s.result = results[s.job_id]
    print(f"\n{len(ids)} Slurm jobs finished in {time.monotonic() - started:.1f} s")
    yield submitted


# ---------------------------------------------------------------------------------------------------------
# reading a job's log


def records(output: str, kind: str) -> list[dict[str, Any]]:
    return [json.loads(m.group(1)) for m in re.finditer(rf"^CAI_MPI_JOB_CHECK {kind} (\{{.*\}})$", output, re.M)]


def by_rank(recs: list[dict[str, Any]], what: str, n: int, output: str) -> dict[int, dict[str, Any]]:
    ranks = collections.Counter(r["rank"] for r in recs)
    assert sorted(ranks) == list(range(n)) and set(ranks.values()) == {1}, (
        f"expected one {what} line from each of ranks 0..{n - 1}, got {dict(ranks)}\n{output}"
    )
    return {r["rank"]: r for r in recs}


def expected_local_ranks(devices: dict[int, dict[str, Any]]) -> dict[int, int]:
    """Node-local rank as the block layout gives it: position among the ranks of the same node."""
    per_node: dict[str, list[int]] = collections.defaultdict(list)
    for rank in sorted(devices):
        per_node[devices[rank]["node"]].append(rank)
    return {rank: ranks.index(rank) for ranks in per_node.values() for rank in ranks}


def get(jobs: dict[str, Submitted], name: str) -> Any:
    s = jobs[name]
    if s.skip:
        pytest.skip(f"{name}: {s.skip}")
    return s.result


def explain(result: Any, cluster: Any) -> str:
    """A failed job's state and log, with the cluster's known problems and daemon logs."""
    notes = "".join(f"\nNOTE: {n}" for n in cluster.notes)
    return f"{result.describe()}{notes}\n{cluster.diagnostics(lines=15)}"


# ---------------------------------------------------------------------------------------------------------
# tests


PASSING = [c for c in CASES if c.expect == "pass"]


@pytest.mark.parametrize("case", PASSING, ids=[c.name for c in PASSING])
def test_template_job(case: Case, jobs: dict[str, Submitted], slurm_cluster: Any) -> None:
    result = get(jobs, case.name)
    out = result.output
    assert result.state == "COMPLETED" and result.exit_code == "0:0", explain(result, slurm_cluster)

    assert f"{case.launcher} gpu-bind={case.bind}" in out, out
    if case.preflight == "0":  # no info, no world-size check: the program alone
        assert "== steps 1 and 2 skipped (CAI_MPI_PREFLIGHT=0)" in out and "== step 1:" not in out, out
        assert "== step 2:" not in out and "== step 3:" in out, out
    else:
        # The steps ran in order, each succeeded (the template stops at the first failure).
        steps = [out.find(f"== step {i}:") for i in (1, 2, 3)]
        assert -1 not in steps and steps == sorted(steps), f"missing or unordered steps\n{out}"
        info = out[steps[0] : steps[1]]
        for rank in range(case.ranks):
            assert re.search(rf"\brank\s+{rank}\b", info), f"`cai_mpi info` has no line for rank {rank}\n{out}"
        assert f"world size {case.ranks} == SLURM_NTASKS: ok" in out, out

    if not case.program:  # the demo: its own checks decide the exit code
        assert "== step 3: python -m cai_mpi demo" in out, out
        return

    # Every rank took part, 2 per node, in one world.
    devices = by_rank(records(out, "device"), "device", case.ranks, out)
    assert all(d["size"] == case.ranks for d in devices.values()), out
    per_node = collections.Counter(d["node"] for d in devices.values())
    assert len(per_node) == case.nodes and set(per_node) <= set(NODES), out
    assert set(per_node.values()) == {GPUS_PER_NODE}, out

    # Each rank's GPU is what the binding style should give.
    local = expected_local_ranks(devices)
    for rank, d in sorted(devices.items()):
        where = f"rank {rank}: {d}"
        assert d["local_rank"] == local[rank], where
        if case.bind == "none":
            # CPU nodes: no GPU reached the task, and cai_mpi chose none.
            assert d["cuda_visible_devices"] is None and d["ordinal"] is None, where
        elif case.bind == "per-task":
            # Slurm bound one GPU to the task (CUDA_VISIBLE_DEVICES has one id): the rank uses device 0.
            assert d["cuda_visible_devices"] is not None and len(d["cuda_visible_devices"].split(",")) == 1, where
            assert (d["visible_count"], d["ordinal"]) == (1, 0), where
        else:
            # Every rank sees the node's GPUs: node-local rank modulo visible devices.
            assert d["visible_count"] == GPUS_PER_NODE, where
            assert d["ordinal"] == d["local_rank"] % GPUS_PER_NODE, where
            # srun --gpu-bind=none (Slurm 22.05) unsets CUDA_VISIBLE_DEVICES, and cai_mpi counts the GPUs from
            # SLURM_GPUS_ON_NODE; mpirun's ranks inherit its daemon step's CUDA_VISIBLE_DEVICES=0,1.
            cvd = d["cuda_visible_devices"]
            assert (cvd is None and "SLURM_GPUS_ON_NODE" in d["reason"]) or cvd == "0,1", where
        for key, value in case.mpi_env.items():
            assert d["mpi_env"].get(key) == value, f"{key} should reach every rank as {value!r}; {where}"
    if case.bind == "per-task":  # and no two ranks of a node share a GPU
        for node in per_node:
            ids = [d["cuda_visible_devices"] for d in devices.values() if d["node"] == node]
            assert len(set(ids)) == len(ids), f"{node}: ranks share a GPU: {ids}"

    # Data arrived intact around the ring.
    oks = by_rank(records(out, "ok"), "ok", case.ranks, out)
    for rank, ok in oks.items():
        assert ok["received_from"] == (rank - 1) % case.ranks and ok["cases"] == 7, ok
    assert "CAI_MPI_JOB_CHECK FAIL" not in out, out
    assert f"CAI_MPI_JOB_CHECK summary all ranks ok ({case.ranks} ranks)" in out, out


def test_mislaunched_srun_fails_loudly(jobs: dict[str, Submitted]) -> None:
    result = get(jobs, "mislaunch")
    out = result.output
    assert result.state == "FAILED", result.describe()
    assert out.count("FATAL: MPI world size 1 != SLURM_NTASKS 4") == 4, out
    assert "== step 3:" not in out, "the program must not start after a failed world-size check\n" + out


FAILING = [c for c in CASES if c.expect == "rank fails"]


@pytest.mark.parametrize("case", FAILING, ids=[c.name for c in FAILING])
def test_a_rank_that_raises_ends_the_job_with_its_traceback(case: Case, jobs: dict[str, Submitted]) -> None:
    result = get(jobs, case.name)
    out = result.output
    # FAILED, not TIMEOUT or cancelled by the test: the job ended on its own, long before its time limit.
    assert result.state == "FAILED", result.describe()
    assert "== step 3:" in out, "the program should have started\n" + result.describe()
    assert f"cai_mpi: rank 1 of {case.ranks} (host " in out and "aborting MPI_COMM_WORLD" in out, result.describe()
    assert "RuntimeError: rank 1 fails on purpose" in out, result.describe()


def test_mpirun_refuses_one_gpu_per_task(jobs: dict[str, Submitted]) -> None:
    result = get(jobs, "mpirun/per-task")
    assert result.state == "FAILED", result.describe()
    assert "CAI_MPI_LAUNCHER=mpirun needs CAI_MPI_GPU_BIND=all" in result.output, result.describe()
    assert "== step 1:" not in result.output, result.describe()


def test_a_gpu_binding_on_cpu_nodes_is_refused(jobs: dict[str, Submitted]) -> None:
    result = get(jobs, "cpu-nodes/per-task")
    assert result.state == "FAILED", result.describe()
    assert "CAI_MPI_GPU_BIND=per-task but the job has no GPUs" in result.output, result.describe()
    assert "== step 1:" not in result.output, result.describe()


def test_cray_variant_warns_without_gtl(jobs: dict[str, Submitted]) -> None:
    # The MPICH wheel has no GTL: the Cray branch must say so before Cray MPICH would abort.
    result = get(jobs, "cray/all")
    assert "libmpi_gtl_cuda is neither linked" in result.output, result.describe()


def test_templates_pass_shellcheck(shellcheck: str) -> None:
    scripts = sorted(SLURM_DIR.glob("*.sbatch")) + sorted(SLURM_DIR.glob("*.sh"))
    assert scripts, f"no templates in {SLURM_DIR}"
    proc = subprocess.run(
        [shellcheck, "--shell=bash", "--severity=style", *map(str, scripts)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
