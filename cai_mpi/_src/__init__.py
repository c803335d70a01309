"""Private implementation of cai_mpi; the public surface is cai_mpi/__init__.py."""
