"""`python -m cai_mpi bench`: latency, bandwidth and pipeline benchmarks of cai_mpi next to raw mpi4py."""

from __future__ import annotations

from . import persistent

# The persistent and bucketed modes build on multirank's collective modes: added to its tables once, here, before
# any other module of the bench reads them.
persistent.register()

from .cli import main  # noqa: E402  (after the tables are complete)

__all__ = ["main"]
