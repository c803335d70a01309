"""Command line: `python -m cai_mpi {info,demo,bench,run,soak}` (also installed as `cai-mpi`)."""

from __future__ import annotations

import importlib
import sys

__all__ = ["main"]

_USAGE = """usage: python -m cai_mpi [--version] COMMAND [options]   (run under mpiexec for several ranks)

commands:
  info    what this MPI/GPU setup looks like to cai_mpi (CUDA-aware?, GPUs, versions, settings)
  demo    send arrays of many layouts around a ring of ranks and check them exactly
  bench   latency / bandwidth / pipeline benchmarks, side by side with raw mpi4py
  run     run a script so that an uncaught exception on any rank ends the whole job (MPI Abort)
  soak    every rank sends to every other in every way, checks each message, watches memory

examples:
  mpiexec -n 2 python -m cai_mpi info
  mpiexec -n 4 python -m cai_mpi demo
  python -m cai_mpi bench --help    # each command's --help has its own examples
"""

# Each command is a module with main(argv) -> exit status, imported only when asked for.
_COMMANDS = {
    "info": "._src.cli.info", "demo": "._src.cli.demo", "bench": "._src.cli.bench", "run": "._src.cli.run",
    "soak": "._src.cli.soak",
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if args else 2
    if args[0] == "--version":
        from . import __version__

        print(f"cai_mpi {__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command not in _COMMANDS:
        print(f"unknown command {command!r}\n\n{_USAGE}", file=sys.stderr)
        return 2
    module = importlib.import_module(_COMMANDS[command], __package__)
    return int(module.main(rest))


if __name__ == "__main__":
    sys.exit(main())
