"""`python -m cai_mpi bench`: latency, bandwidth and pipeline benchmarks of cai_mpi next to raw mpi4py."""

from __future__ import annotations

from .cli import main

__all__ = ["main"]
