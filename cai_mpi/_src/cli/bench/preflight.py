"""What bench checks before the ranks exchange anything (so a bad option ends every rank at once, none left waiting
in MPI for another), and how a failure once they have started ends the whole job."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import NoReturn

from mpi4py import MPI

__all__ = ["abort_job", "output_problems"]

PROG = "python -m cai_mpi bench"


def _writable(option: str, path: str) -> str | None:
    """Why ``path`` cannot be written as ``option``'s file, or None. Nothing is created."""
    if os.path.isdir(path):
        return f"{option} {path} is a directory: give a file name"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"{option} {path}: the directory {folder} does not exist"
    if os.path.exists(path):
        return None if os.access(path, os.W_OK) else f"{option} {path} is not writable"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{option} {path}: cannot create a file in {folder} (no write permission)"
    return None


def _plot_backend() -> str | None:
    """Why ``--plot`` cannot draw here, or None: matplotlib and its file backend must import."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot
    except ImportError as exc:
        return f"--plot needs matplotlib ({exc}): pip install 'cai_mpi[bench]', or leave out --plot"
    return None


def output_problems(args: argparse.Namespace) -> list[str]:
    """Why the files rank 0 will write (``--json``, ``--plot``) cannot be written: checked before anything runs."""
    problems = []
    if args.json:
        problems.append(_writable("--json", args.json))
    if args.plot:
        problems.append(_writable("--plot", args.plot))
        problems.append(_plot_backend())
    return [p for p in problems if p is not None]


def abort_job(rank: int) -> NoReturn:
    """A rank failed once the ranks had started exchanging: the others may be waiting for it in MPI, so end the
    job (MPI Abort) with the reason, never leave them hanging."""
    exc = sys.exc_info()[1]
    traceback.print_exc()
    what = f"{type(exc).__name__}: {exc}" if exc is not None else "unknown error"
    sys.stderr.write(f"{PROG}: rank {rank} failed ({what}); aborting all ranks\n")
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(1)
    raise SystemExit(1)  # (not reached: Abort ends the process)
