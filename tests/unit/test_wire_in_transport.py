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
