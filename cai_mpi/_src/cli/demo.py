"""`python -m cai_mpi demo`: arrays of many layouts and dtypes travel around a ring of ranks, checked exactly."""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from ..api.p2p import isend_array, recv_array
from ..arrays.array import Array
from ..config import config
from ..runtime import get_runtime, set_runtime

__all__ = ["main"]


def _samples(n: int) -> list[tuple[str, Any, np.ndarray[Any, Any]]]:
    """(name, object to send, expected contents) on the sending rank."""
    from ...testing import FakeCudaArray, SimulatedStream

    rng = np.random.default_rng(2026)
    base = rng.standard_normal((n, n))
    structured = np.zeros(n, dtype=[("id", "<i4"), ("pos", "<f8", (3,)), ("ok", "?")])
    structured["id"] = np.arange(n)
    structured["pos"] = rng.standard_normal((n, 3))
    samples: list[tuple[str, Any, np.ndarray[Any, Any]]] = [
        ("float32 C", base.astype(np.float32), base.astype(np.float32)),
        ("float64 F-order", np.asfortranarray(base), base),
        ("int16 negative strides", np.arange(n * n, dtype=np.int16).reshape(n, n)[::-1, ::-2],
         np.arange(n * n, dtype=np.int16).reshape(n, n)[::-1, ::-2]),
        ("complex128", base + 1j * base.T, base + 1j * base.T),
        ("bool", base > 0, base > 0),
        ("structured", structured, structured),
        ("0-d float16", np.float16(1.5) * np.ones((), np.float16), np.float16(1.5) * np.ones((), np.float16)),
        ("zero-size", np.zeros((0, n)), np.zeros((0, n))),
    ]
    rt = get_runtime()
    if rt.name == "cuda":
        import cupy

        dev = cupy.asarray(base)
        samples.append(("cupy float64", dev, base))
    else:
        # A CAI exporter whose data is still being written on a (simulated) stream when we send it:
        # cai_mpi synchronizes the stream first, so the ring sees the final values.
        stream = SimulatedStream("demo-producer")
        fake = FakeCudaArray.zeros((n, n), "f8", stream=stream)
        stream.enqueue(np.copyto, fake.host, base, delay=0.05)
        samples.append(("CAI v3 object, stream busy", fake, base))
    return samples


_EXAMPLES = """examples:
  mpiexec -n 4 python -m cai_mpi demo
  mpiexec -n 2 python -m cai_mpi demo --size 1024    # larger arrays

Rank 0 prints each array's shape, dtype, hops and result; the exit status is 1 if any arrived changed.
Without a GPU the demo runs on host memory (its first line says so, and why); the last array is then written by
a background thread acting as a GPU stream, and cai_mpi waits for that writer to finish before sending it."""


def _placement() -> str:
    """Where the demo's arrays live on rank 0, and why, in words (before a simulated stream is installed)."""
    rt = get_runtime()
    if rt.device_count():
        return f"on GPU {rt.current_device()} (CUDA)"
    if config().runtime == "host":
        why = "CAI_MPI_RUNTIME=host"
    else:
        from ..runtime.cudadriver import probe

        usable, reason = probe()
        why = "no GPU found" + ("" if usable else f" ({reason.split(': ', 1)[0].split('; ', 1)[0]})")
    return f"on host memory: {why}"


#: The demo's second line on host memory: what its last array shows without a GPU, in plain words.
HOST_NOTE = ("No GPU here, so the last array is written by a background thread acting as a GPU stream: cai_mpi waits "
             "for that writer to finish before sending, as it waits for a GPU's kernels.")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m cai_mpi demo", description=__doc__, epilog=_EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--size", type=int, default=64, help="edge length of the sample arrays (default 64)")
    args = p.parse_args(argv)
    placement = _placement()
    if get_runtime().device_count() == 0:
        # No GPU: simulated streams stand in for a GPU's, so the demo still shows the stream being waited for.
        from ...testing import SimulatedRuntime

        set_runtime(SimulatedRuntime(devices=0))
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    count = len(_samples(2)) if rank != 0 else 0
    count = comm.bcast(len(_samples(2)) if rank == 0 else count, root=0)
    failures = 0
    rows = []
    t0 = time.perf_counter()
    if rank == 0:
        samples = _samples(args.size)
        for i, (name, obj, expected) in enumerate(samples):
            req = isend_array(obj, nxt, tag=i, meta={"name": name, "hops": 1})
            back = recv_array(prv, tag=i)
            req.wait()
            got = back.numpy()
            ok = got.shape == expected.shape and got.dtype == expected.dtype and np.array_equal(
                got.view(np.uint8) if got.dtype.names else got, np.ascontiguousarray(expected).view(np.uint8)
                if got.dtype.names else expected)
            failures += not ok
            rows.append((name, str(got.shape), str(got.dtype) if not got.dtype.names else "structured",
                         back.meta["hops"] if back.meta else "?", "ok" if ok else "MISMATCH"))
    else:
        for i in range(count):
            a: Array = recv_array(prv, tag=i)
            # Forward the received Array itself: its descriptor travels on, zero-copy.
            meta = dict(a.meta or {})
            meta["hops"] = meta.get("hops", 0) + 1
            isend_array(a, nxt, tag=i, meta=meta).wait()
    failures = comm.allreduce(failures)
    if rank == 0:
        dt = time.perf_counter() - t0
        print(f"cai_mpi demo: {len(rows)} arrays around a ring of {size} rank(s) {placement}")
        if placement.startswith("on host memory"):
            print(HOST_NOTE)
        print(f"{'array':<28} {'shape':<12} {'dtype':<12} {'hops':>4}  result")
        for name, shape, dtype, hops, result in rows:
            print(f"{name:<28} {shape:<12} {dtype:<12} {hops:>4}  {result}")
        print(f"{'all arrays arrived intact' if not failures else f'{failures} MISMATCH(ES)'} "
              f"in {dt * 1e3:.1f} ms")
    return 1 if failures else 0
