"""``python -m cai_mpi soak`` under mpiexec, bounded: every kind of round runs, every message arrives intact
(failures 0), nothing is left pending, and the figures it reports are there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from launch import run_ranks

from cai_mpi._src.cli.soak.rounds import KINDS

LIMIT = 240  # seconds: each run takes a few; this only tells a hang from a busy machine


def soak(tmp_path: Path, nprocs: int, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    out = tmp_path / "soak.json"
    done = run_ranks(nprocs, ["-m", "cai_mpi", "soak", "--timeout", "60", "--json", str(out), *args], timeout=LIMIT,
                     env=env)
    assert done.returncode == 0, done.output
    result: dict[str, Any] = json.loads(out.read_text())
    assert result["failures"] == 0 and result["failure_details"] == [], done.output
    assert "failures: 0" in done.stdout, done.output
    return result


@pytest.mark.parametrize("nprocs", [2, 3])
def test_soak_delivers_every_message_intact(tmp_path: Path, nprocs: int) -> None:
    result = soak(tmp_path, nprocs, "--messages", "600", "--max-bytes", "2M")
    assert result["ranks"] == nprocs and result["threads"] == 2 and result["messages"] >= 600
    assert all(result["by_kind"][kind]["messages"] > 0 for kind in KINDS), result["by_kind"]
    assert result["bytes"] == sum(row["bytes"] for row in result["by_kind"].values()) > 0
    assert len(result["memory_per_rank"]) == nprocs
    for memory in result["memory_per_rank"]:
        assert memory["samples"] >= 2 and memory["rss_peak_mib"] >= memory["rss_start_mib"] > 0
    assert result["command"].startswith("python -m cai_mpi soak --timeout 60")


def test_soak_on_the_simulated_gpu_runtime(tmp_path: Path) -> None:
    """Device arrays (staged: the simulated runtime is not CUDA-aware) on every rank, one thread."""
    result = soak(tmp_path, 2, "--messages", "300", "--max-bytes", "1M", "--threads", "1", "--simulated-gpu")
    assert result["runtime"] == "simulated" and result["threads"] == 1 and result["messages"] >= 300


def test_soak_needs_two_ranks() -> None:
    done = run_ranks(1, ["-m", "cai_mpi", "soak", "--messages", "10"], timeout=LIMIT)
    assert done.returncode == 2 and "run it on 2 or more ranks" in done.stderr, done.output


# The soak with a planted failure: every channel carries 8 MiB (beyond any eager limit, so a send waits for its
# receiver), and rank 1's channel receives fail. The other ranks' sends to rank 1 then time out, and so does closing
# their channels: the worker's cleanup must not wait for ever for a receive that will never come.
PLANTED = r"""
import sys
import numpy as np
from mpi4py import MPI
from cai_mpi._src.api.channel import RecvChannel
from cai_mpi._src.cli.soak import cli, rounds
from cai_mpi._src.cli.soak.messages import HOST, Spec

described = rounds.Worker._spec

def big_channels(self, ident, **kw):
    if ident[0] == -1:  # a channel's fixed description
        return Spec(ident, np.dtype("<f8"), (1 << 20,), "C", HOST)
    return described(self, ident, **kw)

def fail(self, timeout=None):
    raise RuntimeError("planted: a channel receive failed")

rounds.Worker._spec = big_channels
if MPI.COMM_WORLD.Get_rank() == 1:
    RecvChannel.recv = fail
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("nprocs", [2, 3])
def test_a_soak_whose_channel_receives_fail_ends_and_lists_the_failures(tmp_path: Path, nprocs: int) -> None:
    out = tmp_path / "soak.json"
    done = run_ranks(nprocs, ["-c", PLANTED, "--messages", "120", "--threads", "1", "--timeout", "3",
                              "--json", str(out)], timeout=LIMIT)
    assert done.returncode == 1, done.output
    result = json.loads(out.read_text())
    details = "\n".join(result["failure_details"])
    assert result["failures"] > 0 and f"failures: {result['failures']}" in done.stdout, done.output
    assert "rank 1 thread 0" in details and "planted: a channel receive failed" in details, details
    # Every other rank's send to rank 1 times out, and then its close: both listed, with what they waited for.
    for rank in range(nprocs):
        if rank != 1:
            assert f"rank {rank} thread 0: closing the channel to rank 1: TimeoutError: SendChannel.close: the " \
                "message to rank 1" in details, details


# A wait that does not honour --timeout at all (planted: rank 1's channel receives never return) must not hang the
# soak either: the thread is reported as stuck once it has finished no round for three timeouts, and the job ends.
STUCK = r"""
import sys, threading
from mpi4py import MPI
from cai_mpi._src.api.channel import RecvChannel
from cai_mpi._src.cli.soak import cli

def never(self, timeout=None):
    threading.Event().wait()

if MPI.COMM_WORLD.Get_rank() == 1:
    RecvChannel.recv = never
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("nprocs", [2, 3])
def test_a_soak_with_a_wait_that_never_returns_ends_and_says_so(tmp_path: Path, nprocs: int) -> None:
    out = tmp_path / "soak.json"
    done = run_ranks(nprocs, ["-c", STUCK, "--messages", "120", "--threads", "1", "--timeout", "2",
                              "--json", str(out)], timeout=LIMIT)
    assert done.returncode != 0, done.output
    result = json.loads(out.read_text())
    details = "\n".join(result["failure_details"])
    assert "rank 1 thread 0: round" in details and "finished nothing for 6 s" in details, details
    assert "the job is aborted" in details, details
