"""The stream policy itself (cai_mpi/_src/arrays/sync.py), call by call: which wait each kind of memory and CAI
version gets.
The end-to-end ordering tests (test_device_ordering.py) check the data; these pin the exact waits, so a policy that
waits for the wrong stream, or on pageable memory no GPU can write, fails here (survivors of the mutation run,
docs/testing.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest

from cai_mpi._src.arrays.sync import sync_enabled, sync_producer, sync_unnamed
from cai_mpi._src.config import reload_config
from cai_mpi._src.core.descriptor import CAIDescriptor
from cai_mpi._src.runtime.base import LEGACY_STREAM, PER_THREAD_STREAM, Location, MemoryKind, Runtime

STREAM = 0x7F00  # a non-default stream handle


class RecordingRuntime:
    """Only the three waits the policy may ask for, recorded in order."""

    def __init__(self) -> None:
        self.waits: list[tuple[Any, ...]] = []

    def sync_stream(self, handle: int, ordinal: int | None) -> None:
        self.waits.append(("stream", handle, ordinal))

    def sync_legacy(self, ordinal: int | None) -> None:
        self.waits.append(("legacy", ordinal))

    def sync_device(self, ordinal: int | None) -> None:
        self.waits.append(("device", ordinal))


@pytest.fixture(autouse=True)
def default_config() -> Iterator[None]:
    reload_config({})
    yield
    reload_config()


def waits_of(version: int, stream: int | None, location: Location) -> list[tuple[Any, ...]]:
    rt = RecordingRuntime()
    desc = CAIDescriptor(ptr=0x1000, shape=(4,), typestr="<f4", version=version, stream=stream)
    sync_producer(desc, location, cast(Runtime, rt))
    return rt.waits


DEVICE0 = Location(MemoryKind.DEVICE, 0)
MANAGED1 = Location(MemoryKind.MANAGED, 1)
PINNED0 = Location(MemoryKind.HOST, 0)  # host memory a GPU's context knows: a kernel may write it
PAGEABLE = Location(MemoryKind.HOST)


@pytest.mark.parametrize(("version", "stream", "location", "expected"), [
    (3, STREAM, DEVICE0, [("stream", STREAM, 0)]),
    (4, STREAM, DEVICE0, [("stream", STREAM, 0)]),  # a newer version is read as version 3: its stream counts
    (3, LEGACY_STREAM, MANAGED1, [("stream", LEGACY_STREAM, 1)]),
    (3, STREAM, PAGEABLE, [("stream", STREAM, None)]),
    (3, None, DEVICE0, [("legacy", 0)]),  # v3 None: exporters break the "nothing pending" promise
    (2, None, DEVICE0, [("legacy", 0)]),
    (0, None, MANAGED1, [("legacy", 1)]),
    (2, None, PINNED0, [("legacy", 0)]),
    (2, None, PAGEABLE, []),  # pageable memory no stream names: no GPU can be writing it
    (3, None, PAGEABLE, []),
], ids=["v3-stream-device", "v4-stream-device", "v3-legacy-managed", "v3-stream-pageable", "v3-none-device",
        "v2-device", "v0-managed", "v2-pinned", "v2-pageable", "v3-none-pageable"])
def test_sync_producer_waits_for_exactly_what_may_still_write(
    version: int, stream: int | None, location: Location, expected: list[tuple[Any, ...]]
) -> None:
    assert waits_of(version, stream, location) == expected


@pytest.mark.parametrize(("stream", "expected"), [
    (None, [("legacy", 3)]),
    (LEGACY_STREAM, [("legacy", 3)]),  # the legacy wait covers it
    (PER_THREAD_STREAM, [("legacy", 3)]),  # blocking: ordered behind the legacy stream
    (STREAM, [("legacy", 3), ("stream", STREAM, 3)]),
])
def test_sync_unnamed_waits_for_the_legacy_stream_and_the_callers_own(
    stream: int | None, expected: list[tuple[Any, ...]]
) -> None:
    rt = RecordingRuntime()
    sync_unnamed(3, cast(Runtime, rt), stream)
    assert rt.waits == expected


@pytest.mark.parametrize("stream", [None, STREAM])
def test_sync_device_waits_for_the_whole_device_instead(stream: int | None) -> None:
    reload_config({"CAI_MPI_SYNC": "device"})
    rt = RecordingRuntime()
    sync_unnamed(2, cast(Runtime, rt), stream)
    assert rt.waits == [("device", 2)]


@pytest.mark.parametrize(("env", "sync", "expected"), [
    ({}, None, True), ({"CAI_MPI_SYNC": "0"}, None, False), ({"CAI_MPI_SYNC": "device"}, None, True),
    ({"CAI_MPI_SYNC": "0"}, True, True), ({}, False, False),
])
def test_sync_enabled_follows_the_setting_unless_forced(env: dict[str, str], sync: bool | None, expected: bool) -> None:
    reload_config(env)
    assert sync_enabled(sync) is expected
