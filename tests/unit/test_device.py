"""choose_device(): the rank -> GPU rule, from environment variables only."""

from __future__ import annotations

import dataclasses
import pathlib
import subprocess
import sys

import pytest

from cai_mpi._src.runtime import device
from cai_mpi._src.runtime.device import LOCAL_RANK_VARS, DeviceChoice, choose_device, parse_visible_devices


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", ()),
        ("0", ("0",)),
        ("0,1", ("0", "1")),
        (" 2 , 3 ", ("2", "3")),
        ("GPU-1a2b,MIG-3c4d", ("GPU-1a2b", "MIG-3c4d")),
        ("0,-1,1", ("0",)),  # CUDA stops at the first invalid entry
        ("NoDevFiles", ()),  # what Slurm writes when a GRES has no device files
        ("-1", ()),
    ],
)
def test_parse_visible_devices(value: str | None, expected: tuple[str, ...] | None) -> None:
    assert parse_visible_devices(value) == expected


@pytest.mark.parametrize("var", LOCAL_RANK_VARS)
def test_every_local_rank_variable_is_read(var: str) -> None:
    choice = choose_device({var: "3", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert (choice.local_rank, choice.local_rank_source, choice.ordinal) == (3, var, 1)
    assert var in choice.reason


def test_one_device_per_task_always_chooses_zero() -> None:
    # srun --gpus-per-task=1: every task sees exactly one device, whatever its local rank.
    for local in range(4):
        choice = choose_device({"SLURM_LOCALID": str(local), "CUDA_VISIBLE_DEVICES": str(local)})
        assert choice.ordinal == 0
        assert choice.visible == (str(local),)
        assert choice.visible_count == 1


def test_all_devices_visible_spreads_ranks() -> None:
    # --gpu-bind=none: every rank sees all four GPUs; local ranks go round robin.
    got = [choose_device({"SLURM_LOCALID": str(r), "CUDA_VISIBLE_DEVICES": "0,1,2,3"}).ordinal for r in range(6)]
    assert got == [0, 1, 2, 3, 0, 1]


def test_order_of_precedence() -> None:
    env = {
        "CAI_MPI_LOCAL_RANK": "5",
        "SLURM_LOCALID": "1",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    }
    assert choose_device(env).local_rank == 5
    del env["CAI_MPI_LOCAL_RANK"]
    choice = choose_device(env)
    assert (choice.local_rank, choice.local_rank_source) == (1, "SLURM_LOCALID")
    env = {
        "MPI_LOCALRANKID": "2",
        "PMI_LOCAL_RANK": "0",
        "PALS_LOCAL_RANKID": "1",
        "CUDA_VISIBLE_DEVICES": "0,1,2",
    }
    assert choose_device(env).local_rank_source == "MPI_LOCALRANKID"


@pytest.mark.parametrize("inner", ["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"])
def test_mpirun_inside_allocation_beats_the_daemons_slurm_localid(inner: str) -> None:
    # mpirun starts one daemon per node with srun: each rank inherits the daemon's SLURM_LOCALID=0.
    env = {"SLURM_LOCALID": "0", inner: "1", "CUDA_VISIBLE_DEVICES": "0,1"}
    choice = choose_device(env)
    assert (choice.local_rank, choice.local_rank_source, choice.ordinal) == (1, inner, 1)
    assert "SLURM_LOCALID=0 ignored" in choice.reason


def test_visible_count_argument_overrides_cuda_visible_devices() -> None:
    choice = choose_device({"SLURM_LOCALID": "3"}, visible_count=2)
    assert (choice.ordinal, choice.visible, choice.visible_count) == (1, None, 2)
    assert choose_device({"SLURM_LOCALID": "3", "CUDA_VISIBLE_DEVICES": "0"}, visible_count=4).ordinal == 3
    with pytest.raises(ValueError, match="visible_count=-1"):
        choose_device({}, visible_count=-1)


def test_gpu_bind_none_counts_the_jobs_gpus_on_the_node() -> None:
    # srun --gpu-bind=none unsets CUDA_VISIBLE_DEVICES; Slurm still says how many GPUs the node gave us.
    got = [choose_device({"SLURM_LOCALID": str(r), "SLURM_GPUS_ON_NODE": "2"}) for r in range(3)]
    assert [c.ordinal for c in got] == [0, 1, 0]
    assert all(c.visible is None and c.visible_count == 2 for c in got)
    assert "SLURM_GPUS_ON_NODE=2" in got[1].reason
    # CUDA_VISIBLE_DEVICES, when set, and visible_count win over it.
    env = {"SLURM_LOCALID": "1", "SLURM_GPUS_ON_NODE": "2", "CUDA_VISIBLE_DEVICES": "3"}
    assert choose_device(env).ordinal == 0
    assert choose_device({"SLURM_LOCALID": "3", "SLURM_GPUS_ON_NODE": "2"}, visible_count=4).ordinal == 3
    assert choose_device({"SLURM_LOCALID": "1", "SLURM_GPUS_ON_NODE": "0"}).ordinal is None
    assert choose_device({"SLURM_LOCALID": "1", "SLURM_GPUS_ON_NODE": "?"}).visible_count is None


def test_unknown_device_count_gives_no_ordinal_and_says_why() -> None:
    choice = choose_device({"SLURM_LOCALID": "1"})
    assert choice.ordinal is None
    assert choice.local_rank == 1
    assert "CUDA_VISIBLE_DEVICES unset" in choice.reason
    assert "visible_count" in choice.reason


@pytest.mark.parametrize("cvd", ["", "NoDevFiles", "-1"])
def test_no_visible_gpu(cvd: str) -> None:
    choice = choose_device({"SLURM_LOCALID": "0", "CUDA_VISIBLE_DEVICES": cvd})
    assert choice.ordinal is None
    assert choice.visible == ()
    assert "no GPU visible" in choice.reason
    assert choose_device({"SLURM_LOCALID": "0"}, visible_count=0).ordinal is None


def test_no_launcher_means_device_zero() -> None:
    choice = choose_device({"CUDA_VISIBLE_DEVICES": "0,1"})
    assert (choice.ordinal, choice.local_rank, choice.local_rank_source) == (0, None, None)
    assert "CAI_MPI_LOCAL_RANK" in choice.reason


def test_cai_mpi_device_forces_the_ordinal() -> None:
    env = {"SLURM_LOCALID": "3", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "CAI_MPI_DEVICE": "2"}
    choice = choose_device(env)
    assert (choice.ordinal, choice.local_rank) == (2, 3)
    assert "CAI_MPI_DEVICE=2" in choice.reason
    # Forcing works without knowing the device count, and an empty value means "not set".
    assert choose_device({"CAI_MPI_DEVICE": "1"}).ordinal == 1
    assert choose_device({"CAI_MPI_DEVICE": "", "SLURM_LOCALID": "1", "CUDA_VISIBLE_DEVICES": "0,1"}).ordinal == 1


def test_cai_mpi_device_beyond_visible_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"CAI_MPI_DEVICE=1: only 1 device\(s\) visible"):
        choose_device({"CAI_MPI_DEVICE": "1", "CUDA_VISIBLE_DEVICES": "3"})


@pytest.mark.parametrize("var", ["CAI_MPI_DEVICE", "CAI_MPI_LOCAL_RANK"])
@pytest.mark.parametrize("bad", ["x", "-1", "1.5"])
def test_bad_user_overrides_are_errors(var: str, bad: str) -> None:
    with pytest.raises(ValueError, match=f"{var}="):
        choose_device({var: bad, "CUDA_VISIBLE_DEVICES": "0,1"})


def test_garbage_launcher_variable_is_skipped_and_reported() -> None:
    choice = choose_device({"SLURM_LOCALID": "n/a", "PMI_LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert (choice.local_rank, choice.local_rank_source) == (1, "PMI_LOCAL_RANK")
    assert "ignored unparsable SLURM_LOCALID='n/a'" in choice.reason


def test_default_env_is_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (*LOCAL_RANK_VARS, "CAI_MPI_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    assert choose_device().ordinal == 1


def test_choice_is_frozen() -> None:
    choice = choose_device({"CUDA_VISIBLE_DEVICES": "0"})
    assert isinstance(choice, DeviceChoice)
    with pytest.raises(dataclasses.FrozenInstanceError):
        choice.ordinal = 3  # type: ignore[misc]


def test_choosing_needs_no_cuda_and_no_mpi() -> None:
    # Load the module with only what it imports (config.py, the one reader of the environment), without the
    # package __init__s (cai_mpi's initializes MPI), in a fresh interpreter: it must choose a device with the
    # standard library alone, so it can run before any CUDA context exists.
    runtime_dir = pathlib.Path(device.__file__).parent
    code = (
        "import importlib, sys, types\n"
        "at_start = set(sys.modules)\n"  # cuda-bindings' .pth imports the empty `cuda` namespace at start-up
        f"for name, path in (('alone', {str(runtime_dir.parent)!r}), ('alone.runtime', {str(runtime_dir)!r})):\n"
        "    package = types.ModuleType(name)\n"
        "    package.__path__ = [path]\n"
        "    sys.modules[name] = package\n"
        "mod = importlib.import_module('alone.runtime.device')\n"
        "mod.choose_device({'SLURM_LOCALID': '1', 'CUDA_VISIBLE_DEVICES': '0,1'})\n"
        "bad = sorted(m for m in set(sys.modules) - at_start if m.split('.')[0] in "
        "('cupy', 'cuda', 'numba', 'torch', 'jax', 'mpi4py', 'numpy', 'cai_mpi'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
