"""Every ``python -m cai_mpi`` command answers ``--help`` with its usage and an example to copy."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cai_mpi.__main__ import _COMMANDS
from cai_mpi._src.cli.bench import cli as bench_cli
from cai_mpi._src.cli.bench.kernels import TESTS


def examples(help_text: str) -> list[str]:
    """The lines of the help's examples, from the first line that starts with ``example(s):`` on."""
    lines = help_text.splitlines()
    for i, line in enumerate(lines):
        head, _, rest = line.strip().partition(":")
        if head.lower() in ("example", "examples"):
            return [text for text in (rest.strip(), *(x.strip() for x in lines[i + 1:])) if text]
    return []


def help_of(*command: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "cai_mpi", *command, "--help"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"python -m cai_mpi {' '.join(command)} --help: exit {proc.returncode}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.one_wheel
def test_the_top_level_help_lists_every_command_with_examples() -> None:
    text = help_of()
    for command in _COMMANDS:
        assert f"\n  {command} " in text, f"{command} is not listed in python -m cai_mpi --help:\n{text}"
    assert any("python -m cai_mpi" in line for line in examples(text)), text


@pytest.mark.one_wheel
@pytest.mark.parametrize("command", list(_COMMANDS))
def test_every_command_has_help_with_an_example(command: str) -> None:
    text = help_of(command)
    assert f"python -m cai_mpi {command}" in text.splitlines()[0], f"not its usage line:\n{text}"
    assert any(f"python -m cai_mpi {command}" in line for line in examples(text)), f"no example:\n{text}"


@pytest.mark.one_wheel
@pytest.mark.parametrize("test", [*TESTS, "report"])
def test_every_benchmark_has_help_with_an_example_that_parses(test: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_cli.main([test, "--help"]) == 0
    text = capsys.readouterr().out
    mine = [line for line in examples(text) if f"python -m cai_mpi bench {test} " in line]
    assert mine, f"python -m cai_mpi bench {test} --help shows no example of itself:\n{text}"
    for line in mine:
        words = shlex.split(line, comments=True)
        args = bench_cli.parser().parse_args(words[words.index("bench") + 1:])
        assert args.test == test


@pytest.mark.one_wheel
def test_version_option_prints_the_package_version() -> None:
    import cai_mpi

    proc = subprocess.run([sys.executable, "-m", "cai_mpi", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert (proc.returncode, proc.stdout.strip()) == (0, f"cai_mpi {cai_mpi.__version__}"), proc


def info_on(factory: str, *args: str) -> str:
    """``python -m cai_mpi info`` with the CUDA driver double made by ``factory`` standing in for cuda-bindings."""
    import os

    env = {**os.environ, "CAI_MPI_TEST_CUDA_DRIVER": f"cai_mpi.testing.cuda_driver:{factory}"}
    env.pop("CAI_MPI_RUNTIME", None)
    proc = subprocess.run([sys.executable, "-m", "cai_mpi", "info", *args], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_info_checks_device_attribution_on_every_gpu() -> None:
    """Each visible GPU gets a buffer, placed as cai_mpi places arrays; bindings that report GPU 0 for it are
    named with the release to install."""
    broken = info_on("ordinal_bug_double")
    assert "device attribution: GPU 0 ok, GPU 1 ok (cuda-bindings reports 0)" in broken
    assert "cuda-bindings 12.9.6 reports the wrong GPU" in broken and "cuda-bindings>=12.9.9,<13" in broken
    fixed = info_on("CudaDriverDouble")
    assert "device attribution: GPU 0 ok, GPU 1 ok\n" in fixed and "reports the wrong GPU" not in fixed
    import json

    report = json.loads(info_on("ordinal_bug_double", "--json"))["ranks"][0]["device_attribution"]
    assert report == {"bindings": "12.9.6", "gpus": [{"gpu": 0, "located": 0, "reported": 0},
                                                      {"gpu": 1, "located": 1, "reported": 0}]}


def test_info_says_when_cai_mpi_itself_misplaces_memory() -> None:
    from cai_mpi._src.cli import info

    found = {"bindings": "13.2.0", "gpus": [{"gpu": 0, "located": 0, "reported": 0},
                                            {"gpu": 1, "located": 0, "reported": 0},
                                            {"gpu": 2, "located": None, "reported": None, "error": "out of memory"}]}
    assert info.attribution_text(found) == (
        "device attribution: GPU 0 ok, GPU 1 WRONG (placed on 0), GPU 2 unchecked")
    tips = info.attribution_advice(found)
    assert any("places device memory on the wrong GPU with cuda-bindings 13.2.0" in t for t in tips), tips
    assert "GPU 2 could not be checked: out of memory" in tips


SIMULATED_PROGRAM = '''
import sys
import numpy as np
from mpi4py import MPI
import cai_mpi
from cai_mpi._src.runtime import get_runtime

rank = MPI.COMM_WORLD.Get_rank()
name = get_runtime().name
if name == "simulated":
    from cai_mpi.testing import FakeCudaArray

    sent = np.arange(1000, dtype=np.float32).reshape(10, 100)[:, ::3]
    if rank == 0:
        cai_mpi.send_array(FakeCudaArray(sent, device=True), 1)
    else:
        got = cai_mpi.recv_array(0)
        assert got.device == 0 and np.array_equal(got.to_host(), sent), got
sys.stdout.write(f"rank {rank} runtime {name} argv {sys.argv[1:]}\\n")
'''


@pytest.mark.parametrize("flag", [["--simulated-gpu"], []])
def test_run_with_simulated_gpu_puts_the_whole_program_on_it(tmp_path: Path, flag: list[str]) -> None:
    """``python -m cai_mpi run --simulated-gpu``: the command line installs the test package's simulated GPU, which
    the library itself knows no name for; device arrays land in its memory. Without the flag: the host runtime."""
    from launch import run_ranks

    program = tmp_path / "program.py"
    program.write_text(SIMULATED_PROGRAM)
    done = run_ranks(2, ["-m", "cai_mpi", "run", *flag, str(program), "--simulated-gpu"], timeout=240,
                     env={"CAI_MPI_RUNTIME": ""})
    assert done.returncode == 0, done.output
    name = "simulated" if flag else "host"
    for rank in (0, 1):  # the program's own arguments are its own, even one spelt like the runner's flag
        assert f"rank {rank} runtime {name} argv ['--simulated-gpu']" in done.stdout, done.output


def test_run_with_only_the_flag_is_a_usage_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "cai_mpi", "run", "--simulated-gpu"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "give a script, -m module or -c command" in proc.stderr, proc.stderr


def test_info_on_a_simulated_gpu_sees_one_gpu_and_the_staged_route() -> None:
    import json

    proc = subprocess.run([sys.executable, "-m", "cai_mpi", "info", "--json", "--simulated-gpu"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (rank,) = json.loads(proc.stdout)["ranks"]
    assert (rank["runtime"], rank["gpus_visible"]) == ("simulated", 1), rank
    assert rank["gpu_route"] == "staged (through pinned host memory)", rank


def test_info_names_compiled_code_and_mpi_4_persistent_collectives() -> None:
    """``accelerators : none`` read as "no GPU" beside a GPU verdict; and an Open MPI 5 that reports MPI 3.1 has
    MPI-4's persistent collectives all the same, which ``allreduce_init`` & co. use: info says so (issue 34)."""
    import json

    proc = subprocess.run([sys.executable, "-m", "cai_mpi", "info"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "compiled code : none (cai_mpi is pure Python)" in proc.stdout and "accelerators" not in proc.stdout
    # both MPI wheels the suite runs on (Open MPI 5, MPICH 4 and later) have them
    assert "MPI-4 persistent collectives: yes (allreduce_init & co. bind MPI's Allreduce_init...)" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "cai_mpi", "info", "--json"], capture_output=True, text=True,
                          timeout=120)
    assert json.loads(proc.stdout)["ranks"][0]["persistent_collectives"] is True


def test_info_shows_what_differs_between_ranks_environments() -> None:
    """The environment line holds what every rank shares; a variable that differs, or that only some ranks have,
    is on the line of each rank that has it, so no rank's launcher variables stand for all (issue 34)."""
    from cai_mpi._src.cli import info

    base = info.collect()
    ranks = []
    for r, env in enumerate([{"CAI_MPI_SYNC": "0", "SLURM_LOCALID": "0", "UCX_TLS": "tcp"},
                             {"CAI_MPI_SYNC": "0", "SLURM_LOCALID": "1"}]):
        ranks.append({**base, "rank": r, "size": 2, "host": f"node{r}", "env": env})
    lines = info.render_text(ranks).splitlines()
    assert "environment   : CAI_MPI_SYNC=0 (the same on every rank)" in lines
    rank_env = [line.strip() for line in lines if line.strip().startswith("environment of rank")]
    assert rank_env == ["environment of rank 0: SLURM_LOCALID=0, UCX_TLS=tcp", "environment of rank 1: SLURM_LOCALID=1"]
    apart = info.render_text([{**ranks[0], "env": {"SLURM_LOCALID": "0"}}, {**ranks[1], "env": {}}]).splitlines()
    assert "environment   : (none the same on every rank: see each rank's)" in apart
    one = info.render_text([{**base, "env": {"SLURM_LOCALID": "0"}}]).splitlines()
    assert "environment   : SLURM_LOCALID=0" in one and not any("environment of rank" in x for x in one)
