"""The largest header there is: a host payload of 64 KiB inline (``CAI_MPI_INLINE_BYTES`` at its maximum) with a
``meta`` near its 16 KiB limit and a long structured dtype, sent to this rank and received intact: receivers post
header buffers of ``HEADER_BUFFER_BYTES`` and every header must fit one (a survivor of the mutation run: a buffer
sized for a 74-byte inline payload passed every test, docs/testing.md)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.config import reload_config

me = MPI.COMM_WORLD.Get_rank()
LARGEST_INLINE = 65536  # docs/environment.md: CAI_MPI_INLINE_BYTES is at most 65536
META_LIMIT = 16 << 10  # docs/guide.md: meta is at most 16 KiB as JSON


@pytest.fixture(autouse=True)
def largest_inline() -> Iterator[None]:
    reload_config({"CAI_MPI_INLINE_BYTES": str(LARGEST_INLINE)})
    yield
    reload_config()


def round_trip(obj: np.ndarray, meta: dict[str, str]) -> cai_mpi.Array:
    req = cai_mpi.isend_array(obj, me, 17, meta=meta)
    got = cai_mpi.recv_array(me, 17)
    req.wait()
    return got


@pytest.mark.parametrize("dtype", [np.dtype("u1"), np.dtype([(f"field_{i:03d}", "<i2") for i in range(64)])],
                         ids=["bytes", "structured"])
def test_a_64_kib_inline_payload_with_a_full_meta_arrives_intact(dtype: np.dtype) -> None:
    x = np.frombuffer(np.random.default_rng(5).bytes(LARGEST_INLINE), dtype)
    meta = {"note": "m" * (META_LIMIT - 64)}
    got = round_trip(x, meta)
    assert np.asarray(got).dtype == dtype and np.asarray(got).tobytes() == x.tobytes()
    assert got.meta == meta
