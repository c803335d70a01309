"""``allreduce_init`` of a list or dict reads the arrays bound at creation at every use: an entry rebound to another
array (``grads[k] = new``, as functional code does every step), or a key added or removed, is refused at the next
use with a ValueError naming the entries, on every rank that rebound it and before anything is started (the ranks
stay in step); writing into the bound arrays in place keeps working. Values are small integers: sums are exact."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi.testing import FakeCudaArray, SimulatedRuntime, use_runtime

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(30)]

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
LARGE = 128 * 1024 // 8  # elements of a float64 array large enough for an Allreduce of its own
LIMIT = 10.0  # s, every use: a refusal that left the ranks out of step fails the next use, not the 30 s watchdog


def values(r: int, n: int, step: int) -> np.ndarray[Any, Any]:
    return (np.arange(n) % 11 + r + step).astype("f8")


def total(n: int, step: int) -> np.ndarray[Any, Any]:
    return np.sum([values(r, n, step) for r in range(size)], axis=0)


SIZES = {"w": 6, "b": 3, "big": LARGE}


def fresh(step: int) -> dict[str, np.ndarray[Any, Any]]:
    return {k: values(rank, n, step) for k, n in SIZES.items()}


def check(got: Any, step: int) -> None:
    items = got.items() if isinstance(got, dict) else zip(SIZES, got, strict=True)
    for k, a in items:
        assert np.array_equal(np.asarray(a), total(SIZES[k], step)), (k, step)


@pytest.mark.parametrize("key", ["w", "big"])
@pytest.mark.parametrize("shape", ["same", "other"])
def test_a_dict_entry_rebound_is_refused_naming_it(comm: MPI.Intracomm, key: str, shape: str) -> None:
    grads = fresh(0)
    with cai_mpi.allreduce_init(grads, comm=comm) as red:
        check(red(timeout=LIMIT), 0)
        bound = grads[key]
        grads[key] = values(rank, SIZES[key] + (shape == "other"), 1)  # a new array, as functional code makes
        for use in (red, red.start):
            with pytest.raises(ValueError, match=f"allreduce_init: the entry '{key}' was rebound") as err:
                use()
            assert "in place" in str(err.value) and "new allreduce_init" in str(err.value)
        grads[key] = bound  # bound again: refused without starting, so the ranks are still in step
        for k, n in SIZES.items():
            grads[k][...] = values(rank, n, 2)  # in place: what a persistent allreduce reads
        check(red(timeout=LIMIT), 2)


def test_several_entries_and_keys_added_or_removed(comm: MPI.Intracomm) -> None:
    grads = fresh(0)
    with cai_mpi.allreduce_init(grads, op="sum", comm=comm) as red:
        w, b = grads["w"], grads["b"]
        grads["w"], grads["b"] = w.copy(), b.copy()
        with pytest.raises(ValueError, match=r"the entries 'w', 'b' were rebound"):
            red(timeout=LIMIT)
        grads["w"], grads["b"] = w, b
        grads["extra"] = np.zeros(2)
        with pytest.raises(ValueError, match=r"key 'extra' added since creation"):
            red(timeout=LIMIT)
        del grads["extra"]
        big = grads.pop("big")
        with pytest.raises(ValueError, match=r"key 'big' removed since creation"):
            red(timeout=LIMIT)
        grads["big"] = big
        check(red(timeout=LIMIT), 0)


def test_a_list_entry_rebound_or_appended(comm: MPI.Intracomm) -> None:
    grads = list(fresh(0).values())
    with cai_mpi.allreduce_init(grads, comm=comm) as red:
        check(red(timeout=LIMIT), 0)
        first = grads[1]
        grads[1] = first.copy()
        with pytest.raises(ValueError, match=r"allreduce_init: the entry 1 was rebound"):
            red(timeout=LIMIT)
        grads[1] = first
        grads.append(np.zeros(3))
        with pytest.raises(ValueError, match=r"3 entries at creation, 4 now"):
            red(timeout=LIMIT)
        grads.pop()
        check(red(timeout=LIMIT), 0)


def test_a_device_entry_rebound_is_refused(comm: MPI.Intracomm) -> None:
    with use_runtime(SimulatedRuntime()):
        grads = {k: FakeCudaArray(values(rank, n, 0), device=True) for k, n in SIZES.items()}
        with cai_mpi.allreduce_init(grads, comm=comm) as red:
            check({k: a.numpy() for k, a in red(timeout=LIMIT).items()}, 0)
            grads["b"] = FakeCudaArray(values(rank, SIZES["b"], 1), device=True)
            with pytest.raises(ValueError, match="the entry 'b' was rebound"):
                red(timeout=LIMIT)
