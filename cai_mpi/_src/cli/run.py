"""``python -m cai_mpi run``: run a script, module or command so that an uncaught exception on any rank ends the
whole job (``abort_on_error``), as ``python -m mpi4py`` does; the program sees the ``sys.argv`` it would alone."""

from __future__ import annotations

import argparse
import runpy
from types import TracebackType

import mpi4py.run

from ..api.abort import abort_on_error, abort_with_report, exit_status
from . import simulated

__all__ = ["main"]

_EPILOG = """examples:
  mpiexec -n 4 python -m cai_mpi run train.py --epochs 3
  mpiexec -n 2 python -m cai_mpi run -m mypackage.worker --verbose
  mpiexec -n 2 python -m cai_mpi run -c "import cai_mpi; print(cai_mpi.__version__)"
  mpiexec -n 2 python -m cai_mpi run --simulated-gpu hello.py   # no GPU here: a simulated one (docs/tutorial.md)

An uncaught exception (or sys.exit with a non-zero status) on any rank prints that rank, its host and the
traceback to stderr, then calls MPI_Abort: the job ends at once with a non-zero status instead of leaving the
other ranks blocked. In your own code, cai_mpi.abort_on_error() does the same."""


def _parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="python -m cai_mpi run",
        usage=f"%(prog)s [-h] [{simulated.FLAG}] (script.py | -m module | -c command) [args ...]",
        description="Run a Python program (a script, -m module or -c command) as python would, so that an "
        "uncaught exception on any rank ends the whole MPI job.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _program(argv: list[str], parser: argparse.ArgumentParser) -> tuple[bool, list[str]]:
    """Whether ``--simulated-gpu`` came first, and the program's command line (``script.py args``, ``-m module
    args``, ``-c command args``).

    argparse cannot stop at the script and hand the rest over untouched, so the program's part is found here.
    """
    simulate = bool(argv) and argv[0] == simulated.FLAG
    return simulate, _command(argv[1:] if simulate else argv, parser)


def _command(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    if not argv:
        parser.error("give a script, -m module or -c command to run")
    first = argv[0]
    if first in ("-h", "--help"):
        parser.print_help()
        parser.exit()
    if first in ("-m", "-c"):
        if len(argv) < 2:
            parser.error(f"argument {first}: expected one argument")
        return argv
    if first == "-":
        parser.error("cannot read the program from stdin: under mpiexec only rank 0 has it; give a script")
    if first.startswith("-"):
        parser.error(f"unrecognized option {first} (the program's own options go after its script, -m module "
                     "or -c command)")
    return argv


def _without_runner_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the user's program down: the runner's own frames (this file, mpi4py's, runpy's) go."""
    runner_files = {f.__code__.co_filename for f in (main, mpi4py.run.run_command_line, runpy.run_path)}
    while tb is not None and tb.tb_frame.f_code.co_filename in runner_files:
        tb = tb.tb_next
    return tb


def main(argv: list[str]) -> int:
    """Run the program in ``argv`` on this rank; an uncaught exception aborts MPI_COMM_WORLD (no return then).

    Returns:
        0 when the program ends normally; the exception's exit status when MPI was not running to abort.
    """
    simulate, program = _program(argv, _parser())
    if simulate:
        simulated.install()
    abort_on_error()
    try:
        # mpi4py's runner sets sys.argv and __main__ as python itself would (runpy), and sys.path[0] to a
        # script's directory.
        mpi4py.run.run_command_line(program)
    except BaseException as error:  # SystemExit(0) and SystemExit(None) return: a normal exit
        abort_with_report(error.with_traceback(_without_runner_frames(error.__traceback__)))
        return exit_status(error)
    return 0
