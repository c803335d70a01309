"""The runtime interface is a contract: every method cai_mpi calls on a runtime (host, CUDA, the simulated GPU, one a
user plugs in) must be implemented, and a runtime that leaves one out is refused when it is made, naming what it
lacks, instead of failing on the first transfer that needs it."""

from __future__ import annotations

from typing import Any

import pytest

from cai_mpi._src.runtime.base import Runtime

INTERFACE = [
    "device_count", "current_device", "locate", "sync_stream", "sync_legacy", "sync_device", "stream_wait_event",
    "alloc_device", "alloc_pinned", "create_stream", "copy_async", "record_event", "record_event_on", "pack",
    "unpack",
]


def _without(missing: str) -> type[Runtime]:
    """A Runtime subclass that implements every method of the interface but ``missing``."""
    methods: dict[str, Any] = {name: (lambda self, *args, **kwargs: None) for name in INTERFACE if name != missing}
    return type(f"RuntimeWithout_{missing}", (Runtime,), {"name": "partial", **methods})


def test_a_runtime_with_every_method_can_be_made_and_has_the_defaults() -> None:
    """The two methods with a default: one context scope that does nothing (a runtime without contexts), and a
    consumer's read that a runtime handing out no device memory ignores."""
    rt = _without("")()
    assert isinstance(rt, Runtime)
    with rt.context_scope():
        pass
    assert rt.read_on(0, 0, 0) is None


@pytest.mark.parametrize("missing", INTERFACE)
def test_a_runtime_that_leaves_out_a_method_is_refused_when_made(missing: str) -> None:
    with pytest.raises(TypeError, match=missing):
        _without(missing)()
