"""`python -m cai_mpi soak`: load with every kind of message, each checked; see ``cli``."""

from .cli import main

__all__ = ["main"]
