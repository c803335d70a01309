"""``--simulated-gpu`` of the run, info and soak commands: the whole program on the simulated GPU of
``cai_mpi.testing`` (device memory that MPI must not read, streams that run work later), to try things and to test
on a machine without a GPU.

The library knows only its CUDA and host runtimes; this command line layer, which may use the test tools, installs
the simulated one as an instance (``set_runtime``), as tests do with ``cai_mpi.testing.use_runtime``."""

from __future__ import annotations

import argparse

from ..runtime import Runtime, set_runtime

__all__ = ["FLAG", "HELP", "add_flag", "install"]

FLAG = "--simulated-gpu"
HELP = ("run on a simulated GPU (cai_mpi.testing.SimulatedRuntime) instead of the CUDA or host runtime: device "
        "arrays are host memory that cai_mpi treats as device memory, for trying things without a GPU")


def add_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(FLAG, action="store_true", help=HELP)


def install() -> Runtime:
    """Install a new simulated GPU as this process's runtime (one GPU, as a laptop has) and return it."""
    from ...testing import SimulatedRuntime

    runtime = SimulatedRuntime()
    set_runtime(runtime)
    return runtime
