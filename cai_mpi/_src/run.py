"""``python -m cai_mpi run``: run a script, module or command so that an uncaught exception on any rank ends the
whole job (``abort_on_error``), as ``python -m mpi4py`` does; the program sees the ``sys.argv`` it would alone."""

from __future__ import annotations

import argparse

from mpi4py.run import run_command_line

from .abort import abort_on_error, abort_with_report

__all__ = ["main"]

_EPILOG = """examples:
  mpiexec -n 4 python -m cai_mpi run train.py --epochs 3
  mpiexec -n 2 python -m cai_mpi run -m mypackage.worker
  mpiexec -n 2 python -m cai_mpi run -c "import cai_mpi; print(cai_mpi.__version__)"

An uncaught exception (or sys.exit with a non-zero status) on any rank prints that rank, its host and the
traceback to stderr, then calls MPI_Abort: the job ends at once with a non-zero status instead of leaving the
other ranks blocked. In your own code, cai_mpi.abort_on_error() does the same."""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cai_mpi run", description=__doc__, epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="python -m cai_mpi run [-h] (script.py | -m module | -c command) [args ...]",
    )
    parser.add_argument("program", nargs=argparse.REMAINDER, help="what to run and its arguments, as for python")
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    abort_on_error()
    try:
        run_command_line(list(argv))
    except BaseException as error:  # SystemExit(0) returns; anything else ends the job here
        abort_with_report(error)
    return 0
