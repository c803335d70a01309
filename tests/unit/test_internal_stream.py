"""cai_mpi's own per-thread stream belongs to one runtime: a runtime made after another died (CPython may give it
the dead one's id) gets a stream of its own, never the dead runtime's."""

from __future__ import annotations

import gc
import weakref

from cai_mpi._src.transport import pieces
from cai_mpi.testing import SimulatedRuntime


def test_a_runtime_at_a_dead_runtimes_address_gets_its_own_stream() -> None:
    dead = SimulatedRuntime()
    theirs = pieces.internal_stream(dead, 0)
    address = id(dead)
    del dead
    gc.collect()
    alive = [SimulatedRuntime() for _ in range(1000)]  # the freed memory is used again within a few
    same = [rt for rt in alive if id(rt) == address]
    assert same, "no runtime was made at the dead one's address: this test shows nothing on this interpreter"
    (rt,) = same
    ours = pieces.internal_stream(rt, 0)
    assert ours is not theirs, "the new runtime was handed the dead runtime's stream"
    assert pieces.internal_stream(rt, 0) is ours  # and it keeps its own, once made


def test_a_dead_runtime_is_forgotten_with_its_streams() -> None:
    rt = SimulatedRuntime()
    stream = pieces.internal_stream(rt, 0)
    gone = weakref.ref(stream)
    del rt, stream
    gc.collect()
    assert gone() is None, "the per-thread streams keep a dead runtime's stream alive"
