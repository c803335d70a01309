"""Every MPI operation of a point-to-point message lives in the transport: the API modules of point-to-point
calls, channels and Pipelines check arguments and keep their objects' state, and post, start, wait for, test or
free nothing of MPI themselves (docs/design.md, "Walks")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

API = Path(__file__).resolve().parents[2] / "cai_mpi" / "_src" / "api"
POINT_TO_POINT = ["p2p.py", "channel.py", "channel_ends.py", "pipeline.py", "pipeline_leave.py", "pipeline_wire.py"]
QUERIES = {"Get_rank", "Get_size", "WeakSet"}  # what they may call by a capitalized name: no message operation


def capitalized_calls(source: str) -> set[str]:
    """The names of method calls spelled as mpi4py spells MPI's operations (``comm.Isend(...)``, ``req.Start()``)."""
    return {node.func.attr for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr[:1].isupper()}


def test_the_scan_finds_mpi_operations() -> None:
    found = capitalized_calls("req = comm.Send_init(buf, 1)\nreq.Start()\nMPI.Request.Waitall(reqs)\nx.wait()\n")
    assert found == {"Send_init", "Start", "Waitall"}


@pytest.mark.parametrize("module", POINT_TO_POINT)
def test_no_point_to_point_api_module_calls_mpi(module: str) -> None:
    calls = capitalized_calls((API / module).read_text())
    assert calls <= QUERIES, f"api/{module} calls MPI's {sorted(calls - QUERIES)}: that belongs in transport/"


COLLECTIVES = ["Allgather", "Allgatherv", "Allreduce", "Alltoall", "Alltoallv", "Alltoallw", "Barrier", "Bcast",
               "Exscan", "Gather", "Gatherv", "Reduce", "Reduce_scatter", "Reduce_scatter_block", "Scan", "Scatter",
               "Scatterv"]
#: every form mpi4py spells each collective in: blocking, nonblocking, persistent
COLLECTIVE_CALLS = {form for name in COLLECTIVES for form in (name, "I" + name[0].lower() + name[1:], name + "_init")}


@pytest.mark.parametrize("module", sorted(p.name for p in API.glob("*.py")))
def test_no_api_module_posts_an_mpi_collective(module: str) -> None:
    """Collectives are named and posted in one table, ``transport.agreement.collective`` (issue 42): the API modules
    say which collective and in which form (``posted``, ``prepared``, a ``Joined`` step), never mpi4py's method."""
    calls = capitalized_calls((API / module).read_text()) & COLLECTIVE_CALLS
    assert not calls, f"api/{module} posts MPI's {sorted(calls)} itself: name it through transport.agreement"


def test_the_collective_scan_finds_every_form() -> None:
    found = capitalized_calls("comm.Allreduce_init(a, b, op)\ncomm.Ibcast(buf, 0)\ncomm.Gather(a, b, 0)\n")
    assert found <= COLLECTIVE_CALLS and len(found) == 3
