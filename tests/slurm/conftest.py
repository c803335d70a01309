"""A real Slurm cluster on this machine: munged, slurmctld and two slurmd emulating nodes n1 and n2.

Each emulated node has two fake GPUs (GRES ``gpu`` whose ``File=`` names existing character devices),
so ``--gpus-per-task`` / ``--gpus-per-node`` are accepted and Slurm sets ``CUDA_VISIBLE_DEVICES`` per
task exactly as on a GPU cluster. Everything lives in one private directory (configuration, munge key and
socket, spool, state, logs, the jobs' TMPDIR), on private ports; the daemons and every process of the
jobs carry a tag in their environment, so the finalizer stops exactly those, by PID, and then removes
the directory, also when a test fails or the start itself fails.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

NODES = ("n1", "n2")
CPUS_PER_NODE = 2
GPUS_PER_NODE = 2
PACKAGES = ("slurm-wlm", "munge")
# For srun --mpi=pmix only. libpmix-dev too: Slurm's mpi/pmix plugin dlopens .../pmix2/lib/libpmix.so, a
# symlink only libpmix-dev ships (without it: "pmi/pmix: can not load PMIx library").
PMIX_PACKAGES = ("libpmix2", "libpmix-dev")
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TAG = "CAI_MPI_SLURM_TEST_CLUSTER"  # in the environment of every process the cluster starts
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
    }
)


def _which(name: str) -> str | None:
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:{SYSTEM_PATH}")


def _missing_packages(packages: Sequence[str]) -> list[str]:
    if _which("dpkg-query") is None:  # not Debian: the binaries are all we can check
        return []
    missing = []
    for pkg in packages:
        proc = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True, timeout=30, check=False
        )
        if "install ok installed" not in proc.stdout:
            missing.append(pkg)
    return missing


def ensure_installed(what: str, binaries: Sequence[str], packages: Sequence[str], *, skip: bool = True) -> str | None:
    """apt-get install ``packages`` if a binary or package is absent.

    If that fails: skip the test saying why, or (``skip=False``) return why, for the tests to report.
    """

    def cannot(reason: str) -> str:
        if skip:
            pytest.skip(f"{what} cannot be installed: {reason}")
        return f"{what} could not be installed: {reason}"

    missing = [b for b in binaries if _which(b) is None] + _missing_packages(packages)
    if not missing:
        return None
    why = f"missing {', '.join(missing)}"
    apt = _which("apt-get")
    if apt is None or os.geteuid() != 0:
        return cannot(f"{why}, apt-get as root unavailable; install the Debian packages {' '.join(packages)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "PATH": SYSTEM_PATH}
    install = [apt, "install", "-y", "-q", *packages]

    def attempt(cmd: list[str], timeout: float) -> str | None:
        """None on success, else why not."""
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return f"`{' '.join(cmd)}` took over {timeout:.0f} s"
        if proc.returncode == 0:
            return None
        return f"`{' '.join(cmd)}` failed: {' | '.join((proc.stdout + proc.stderr).strip().splitlines()[-5:])}"

    # The package lists are usually fresh (the test runner installs the rest); update only if needed.
    if attempt(install, 200) is not None:
        error = attempt([apt, "update", "-q"], 120) or attempt(install, 200)
        if error is not None:
            return cannot(f"{why}: {error}")
    still = [b for b in binaries if _which(b) is None] + _missing_packages(packages)
    if still:
        return cannot(f"still missing {', '.join(still)} after apt-get install")
    return None


def _free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _fake_gpu_files(count: int) -> list[str]:
    """Existing character devices to stand in for /dev/nvidia*: Slurm only stats them (no cgroups here)."""
    candidates = [*(f"/dev/tty{i}" for i in range(1, 16)), "/dev/null", "/dev/zero", "/dev/full"]
    found = [c for c in candidates if os.path.exists(c)]
    if len(found) < count:
        pytest.fail(f"need {count} existing device files for fake GPUs, found only {found}")
    return found[:count]


@dataclass
class JobResult:
    job_id: str
    state: str
    exit_code: str
    output: str
    elapsed: float

    def describe(self) -> str:
        head = f"job {self.job_id}: {self.state} (exit {self.exit_code}) after {self.elapsed:.1f} s"
        return f"{head}\n{self.output}"


class SlurmCluster:
    """The running cluster: submit jobs, wait for them, read logs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "etc" / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.jobs: list[str] = []
        self.notes: list[str] = []  # problems to show next to a failed job's output
        self.hostname = socket.gethostname().split(".")[0]
        self.tmpdir = root / "tmp"
        # What every client command (and through sbatch's --export=ALL, every job) sees: nothing of the
        # caller's environment leaks into the jobs except what a test passes on purpose.
        self.env = {
            "PATH": SYSTEM_PATH,
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "SLURM_CONF": str(self.conf),
            "TMPDIR": str(self.tmpdir),
            TAG: str(root),
        }

    # -- configuration -----------------------------------------------------------------------------------

    def write_config(self) -> None:
        for sub in (
            "etc",
            "munge",
            "state",
            "log",
            "tmp",
            *(f"{d}-{n}" for d in ("spool", "tmpfs") for n in NODES),
        ):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        ctld_port, *node_ports = _free_ports(1 + len(NODES))
        r = self.root
        nodes = "\n".join(
            f"NodeName={n} NodeHostname={self.hostname} NodeAddr=127.0.0.1 Port={p} CPUs={CPUS_PER_NODE} "
            f"RealMemory=1000 Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
            for n, p in zip(NODES, node_ports, strict=True)
        )
        self.conf.write_text(
            f"""\
ClusterName=caitest
SlurmctldHost={self.hostname}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
GresTypes=gpu
ReturnToService=2
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmctldTimeout=60
SlurmdTimeout=120
StateSaveLocation={r}/state
SlurmctldPidFile={r}/state/slurmctld.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdPidFile={r}/state/slurmd-%n.pid
SlurmdSpoolDir={r}/spool-%n
SlurmdLogFile={r}/log/slurmd-%n.log
# Per-node TmpFS: the PMIx plugin puts its client directory spmix_appdir_<uid>_<job>.<step> under
# TmpFS (expanded per node), so the two slurmd on this one host do not collide on it.
TmpFS={r}/tmpfs-%n
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=30 State=UP
"""
        )
        gpus = ",".join(_fake_gpu_files(GPUS_PER_NODE))
        (r / "etc" / "gres.conf").write_text(f"AutoDetect=off\nNodeName={','.join(NODES)} Name=gpu File={gpus}\n")

    # -- processes -----------------------------------------------------------------------------------------

    def _spawn(self, name: str, argv: Sequence[str]) -> None:
        log = open(self.root / "log" / f"{name}.console", "wb")  # noqa: SIM115 - owned by the process
        self.procs[name] = subprocess.Popen(
            argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode} during start-up\n{self.diagnostics()}")

    def _wait_for(self, what: str, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            if ready():
                return
            time.sleep(0.25)
        raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}\n{self.diagnostics()}")

    def run(
        self,
        *argv: str,
        timeout: float = 30,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """A client command (sinfo, sbatch...) against this cluster; raises with its output if ``check``."""
        proc = subprocess.run(
            list(argv),
            env=self.env if env is None else env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
        return proc

    def start(self) -> None:
        r = self.root
        self._spawn(
            "munged",
            [
                _which("munged") or "munged",
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={r}/munge/munge.key",
                f"--pid-file={r}/munge/munged.pid",
                f"--log-file={r}/log/munged.log",
                f"--seed-file={r}/munge/seed",
            ],
        )
        self._wait_for("munged's socket", self.munge_socket.exists, 20)
        self._spawn("slurmctld", [_which("slurmctld") or "slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait_for(
            "slurmctld to answer `scontrol ping`",
            lambda: "UP" in self.run("scontrol", "ping", timeout=15, check=False).stdout,
            45,
        )
        for node in NODES:
            self._spawn(f"slurmd-{node}", [_which("slurmd") or "slurmd", "-D", "-N", node, "-f", str(self.conf)])
        self._wait_for("both nodes idle", self._nodes_idle, 60)

    def _nodes_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", timeout=15, check=False).stdout
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in NODES)

    def stop(self) -> None:
        """Cancel jobs, stop the daemons and every process carrying the tag; never raises."""
        with contextlib.suppress(Exception):
            if self.jobs and "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
                self.run("scancel", *self.jobs, timeout=15, check=False)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    out = self.run("squeue", "-h", "-o", "%i", timeout=10, check=False).stdout
                    if not out.strip():
                        break
                    time.sleep(0.5)
        # Job processes first (a stuck slurmstepd keeps its slurmd from exiting), then all daemons at once.
        self._kill_tagged(jobs_only=True)
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
        self._kill_tagged()

    def _tagged(self) -> dict[int, int]:
        """pid -> parent pid of every process (but this one) whose environment carries our tag."""
        marker = f"{TAG}={self.root}".encode()
        found = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if marker in environ.split(b"\0"):
                found[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        return found

    def _kill_tagged(self, jobs_only: bool = False) -> None:
        """SIGKILL leftover processes carrying our tag (slurmstepd, job tasks); ``jobs_only`` spares the
        daemons and their helpers (slurmctld's slurmscriptd)."""
        daemons = {p.pid for p in self.procs.values()}
        for _ in range(3):
            victims = [
                pid for pid, ppid in self._tagged().items() if not (jobs_only and (pid in daemons or ppid in daemons))
            ]
            if not victims:
                return
            for pid in victims:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)

    def diagnostics(self, lines: int = 25) -> str:
        parts = []
        for log in sorted((self.root / "log").glob("*")):
            with contextlib.suppress(OSError):
                text = log.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {log.name} (last {lines} lines)\n" + "\n".join(text))
        return "\n".join(parts)

    # -- jobs ----------------------------------------------------------------------------------------------

    def submit(
        self,
        script: Path,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str],
        cwd: Path,
        options: Sequence[str] = (),
    ) -> str:
        """``sbatch options script args`` in ``cwd``, the cluster's environment plus ``env``; the job id."""
        cwd.mkdir(parents=True, exist_ok=True)
        argv = ("sbatch", "--parsable", *options, str(script), *args)
        proc = self.run(*argv, env={**self.env, **env}, cwd=cwd, timeout=30)
        job_id = proc.stdout.strip().split(";")[0]
        self.jobs.append(job_id)
        return job_id

    def job_state(self, job_id: str) -> tuple[str, str, str]:
        """(state, exit code, working directory's stdout path) from ``scontrol show job``."""
        out = self.run("scontrol", "show", "job", "-o", job_id, timeout=15).stdout
        fields = {m[1]: m[2] for m in re.finditer(r"(\w+)=(\S*)", out)}
        return fields.get("JobState", "?"), fields.get("ExitCode", "?"), fields.get("StdOut", "")

    def wait(self, job_ids: Sequence[str], timeout: float) -> dict[str, JobResult]:
        """Wait until every job ended (or cancel the rest at ``timeout``); returns state and output."""
        start = time.monotonic()
        done: dict[str, JobResult] = {}
        while len(done) < len(job_ids):
            for job_id in job_ids:
                if job_id in done:
                    continue
                state, code, stdout = self.job_state(job_id)
                timed_out = time.monotonic() - start > timeout
                if state in TERMINAL_STATES or timed_out:
                    if state not in TERMINAL_STATES:
                        self.run("scancel", job_id, timeout=15, check=False)
                        state = f"{state}, cancelled by the test after {timeout:.0f} s"
                    output = Path(stdout).read_text(errors="replace") if stdout and Path(stdout).exists() else ""
                    done[job_id] = JobResult(job_id, state, code, output, time.monotonic() - start)
            if len(done) < len(job_ids):
                time.sleep(0.5)
        return done


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Start the cluster once per session; always stopped and removed afterwards."""
    ensure_installed("Slurm", BINARIES, PACKAGES)
    # Without PMIx only the srun-pmix jobs fail, with this note next to their output: no skip.
    pmix_problem = ensure_installed("PMIx for Slurm", (), PMIX_PACKAGES, skip=False)
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster runs slurmd/slurmctld as root (SlurmUser=root); run as root (CI does)")
    cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="cai-slurm-")))
    try:
        if pmix_problem:
            cluster.notes.append(pmix_problem)
        cluster.write_config()
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.fixture(scope="session")
def shellcheck() -> str:
    """The shellcheck binary (installed from Debian's packages if absent and possible)."""
    ensure_installed("shellcheck", ["shellcheck"], ["shellcheck"])
    return _which("shellcheck") or "shellcheck"
