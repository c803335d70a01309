"""Job-side check for the Slurm templates: all ranks joined, each rank's GPU choice, a ring of exact sends.

Run it on every rank of a job (``sbatch slurm/cai_mpi.sbatch slurm/job_check.py``). It prints, per rank,
two machine-readable lines (the Slurm tests parse them; people can read them too)::

    CAI_MPI_JOB_CHECK device {"rank": 1, "node": "n1", "local_rank": 1, "cuda_visible_devices": "1", ...}
    CAI_MPI_JOB_CHECK ok {"rank": 1, "received_from": 0, "cases": 7, "bytes": 4200, ...}

and exits non-zero (so the job fails) if the MPI world is not SLURM_NTASKS ranks or any array arrives
different from what was sent.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

PREFIX = "CAI_MPI_JOB_CHECK"
MPI_ENV = (
    "MPICH_GPU_SUPPORT_ENABLED",
    "MPICH_GPU_IPC_ENABLED",
    "MPIR_CVAR_ENABLE_GPU",
    "CAI_MPI_CUDA_AWARE",
    "OMPI_MCA_pml",
    "UCX_TLS",
)


def emit(kind: str, record: dict[str, Any]) -> None:
    # One write per line, so lines from different ranks never interleave in the job log.
    sys.stdout.write(f"{PREFIX} {kind} {json.dumps(record, sort_keys=True)}\n")
    sys.stdout.flush()


def fail(message: str) -> None:
    sys.stderr.write(f"{PREFIX} FAIL {message}\n")
    sys.stderr.flush()


def check_world_size() -> tuple[int, int]:
    """(rank, size); exits loudly if this is not one MPI job of SLURM_NTASKS ranks."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    # The template exports the job's SLURM_NTASKS as CAI_MPI_NTASKS: ranks that mpirun starts see the
    # SLURM_NTASKS of mpirun's daemon step instead.
    want = os.environ.get("CAI_MPI_NTASKS") or os.environ.get("SLURM_NTASKS")
    if want is not None and int(want) != size:
        fail(
            f"rank {rank}: MPI world size {size} != SLURM_NTASKS {want}: the launcher started separate "
            "MPI jobs (singletons) instead of one; match the launcher to the MPI (slurm/README.md)"
        )
        if size > 1:
            comm.Abort(3)
        sys.exit(3)
    return rank, size


def cases(sender: int, size_hint: int) -> list[tuple[str, Callable[[], Any]]]:
    """Arrays whose every byte depends on the sender, so the receiver can rebuild them exactly."""
    import numpy as np

    base = 1000 * (sender + 1)

    def c_float64() -> Any:
        return np.arange(base, base + 15, dtype=np.float64).reshape(3, 5) / 7.0

    def f_int32() -> Any:
        return np.asfortranarray(np.arange(24, dtype=np.int32).reshape(2, 3, 4) + base)

    def strided_int16() -> Any:
        return (np.arange(60, dtype=np.int16).reshape(6, 10) - base % 500)[::2, 1::3]

    def complex_scalar() -> Any:
        return np.array(complex(sender, -sender - 0.5), dtype=np.complex128)

    def empty() -> Any:
        return np.zeros((0, 3), dtype=np.uint8)

    def big_float32() -> Any:
        # Larger than the header's inline limit, so the payload travels as its own message.
        return np.linspace(sender, sender + 1, size_hint, dtype=np.float32)

    def cai_exporter() -> Any:
        # A __cuda_array_interface__ exporter backed by host memory: the CAI path without a GPU.
        from cai_mpi.testing import FakeCudaArray

        return FakeCudaArray(np.arange(12, dtype=np.float64).reshape(3, 4) * (sender + 2))

    return [
        ("c_float64", c_float64),
        ("f_int32", f_int32),
        ("strided_int16", strided_int16),
        ("complex_scalar", complex_scalar),
        ("empty", empty),
        ("big_float32", big_float32),
        ("cai_exporter", cai_exporter),
    ]


def host_view(obj: Any) -> Any:
    import numpy as np

    return np.asarray(obj.host) if hasattr(obj, "host") else np.asarray(obj)


def ring(rank: int, size: int, size_hint: int) -> dict[str, Any]:
    """Send every case to the right neighbour, receive the left one's, compare exactly."""
    import numpy as np

    import cai_mpi

    right, left = (rank + 1) % size, (rank - 1) % size
    errors, nbytes = [], 0
    mine, theirs = cases(rank, size_hint), cases(left, size_hint)
    for tag, ((name, make), (_, expect)) in enumerate(zip(mine, theirs, strict=True)):
        outgoing = make()
        request = cai_mpi.isend_array(outgoing, right, tag=tag)
        got = np.asarray(cai_mpi.recv_array(left, tag=tag))
        request.wait()
        want = host_view(expect())
        nbytes += got.nbytes
        if got.dtype != want.dtype or got.shape != want.shape:
            errors.append(f"{name}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}")
        elif np.ascontiguousarray(got).tobytes() != np.ascontiguousarray(want).tobytes():
            errors.append(f"{name}: contents differ (first got {got.ravel()[:4]}, want {want.ravel()[:4]})")
    return {"received_from": left, "sent_to": right, "cases": len(mine), "bytes": nbytes, "errors": errors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=100_000, help="size of the large float32 case")
    args = parser.parse_args(argv)

    rank, size = check_world_size()

    from mpi4py import MPI

    from cai_mpi import choose_device

    choice = choose_device()
    emit(
        "device",
        {
            "rank": rank,
            "size": size,
            "node": os.environ.get("SLURMD_NODENAME") or MPI.Get_processor_name(),
            "slurm_procid": os.environ.get("SLURM_PROCID"),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "local_rank": choice.local_rank,
            "local_rank_source": choice.local_rank_source,
            "visible_count": choice.visible_count,
            "ordinal": choice.ordinal,
            "reason": choice.reason,
            # What the template switched on for the MPI library, as this rank sees it.
            "mpi_env": {k: os.environ[k] for k in MPI_ENV if k in os.environ},
        },
    )
    result = ring(rank, size, args.elements)
    ok = not result["errors"]
    for error in result["errors"]:
        fail(f"rank {rank}: from rank {result['received_from']}: {error}")
    if ok:
        emit("ok", {"rank": rank, "size": size, **{k: v for k, v in result.items() if k != "errors"}})
    all_ok = MPI.COMM_WORLD.allreduce(ok, op=MPI.LAND)
    if rank == 0:
        print(f"{PREFIX} summary {'all ranks ok' if all_ok else 'FAILED'} ({size} ranks)", flush=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
