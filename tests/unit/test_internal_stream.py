"""cai_mpi's own per-thread stream belongs to one runtime object: a runtime made after another died (CPython may give
it the dead one's id) gets a stream of its own, never the dead runtime's, and a dead runtime's streams go with it."""

from __future__ import annotations

import gc
import weakref

import pytest

from cai_mpi._src.transport import pieces
from cai_mpi.testing import SimulatedRuntime


def test_runtimes_that_share_an_id_get_streams_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two runtimes alive at once cannot share an id, but one made after another died can: every id is made the same
    # here, so a cache keyed by id hands the second runtime the first one's stream, as CI once saw.
    monkeypatch.setattr(pieces, "id", lambda obj: 0, raising=False)
    first, second = SimulatedRuntime(), SimulatedRuntime()
    theirs = pieces.internal_stream(first, 0)
    ours = pieces.internal_stream(second, 0)
    assert ours is not theirs, "the second runtime was handed the first runtime's stream"
    assert pieces.internal_stream(second, 0) is ours and pieces.internal_stream(first, 0) is theirs


def test_a_dead_runtime_is_forgotten_with_its_streams() -> None:
    rt = SimulatedRuntime()
    stream = pieces.internal_stream(rt, 0)
    gone = weakref.ref(stream)
    del rt, stream
    gc.collect()
    assert gone() is None, "the per-thread streams keep a dead runtime's stream alive"
