"""The pool abstraction: size classes, a byte budget, eviction; host receive buffers lent as arrays."""

from __future__ import annotations

import gc
import sys
import threading
from typing import Any

import numpy as np
import pytest

from cai_mpi._src.config import Config, reload_config
from cai_mpi._src.transport.pool import BlockPool, HostReceivePool, host_receive_pool, size_class

# -- BlockPool -----------------------------------------------------------------------------------------------


class Blocks:
    """Numbered fake blocks: what was made and what was released."""

    def __init__(self) -> None:
        self.made: list[tuple[int, int]] = []
        self.released: list[tuple[int, int]] = []

    def allocate(self, cls: int) -> tuple[int, int]:
        block = (len(self.made), cls)
        self.made.append(block)
        return block

    def release(self, block: tuple[int, int]) -> None:
        self.released.append(block)


def pool_of(budget: int) -> tuple[BlockPool[tuple[int, int]], Blocks]:
    blocks = Blocks()
    return BlockPool(blocks.allocate, blocks.release, budget=lambda: budget), blocks


@pytest.mark.parametrize(("nbytes", "cls"), [(0, 1), (1, 1), (2, 2), (3, 4), (4096, 4096), (4097, 8192)])
def test_size_classes_are_powers_of_two(nbytes: int, cls: int) -> None:
    assert size_class(nbytes) == cls


def test_a_given_back_block_is_taken_again() -> None:
    pool, blocks = pool_of(1 << 20)
    a, cls = pool.take(5000)
    assert cls == 8192 and a == (0, 8192)
    pool.give(a, cls)
    assert pool.idle_bytes == 8192
    assert pool.take(6000) == (a, 8192)  # same class
    assert pool.idle_bytes == 0 and len(blocks.made) == 1


def test_the_budget_caps_idle_bytes_evicting_the_least_recent_class() -> None:
    pool, blocks = pool_of(3 * 4096)
    old = [pool.take(4096)[0] for _ in range(3)]
    for b in old:
        pool.give(b, 4096)
    assert pool.idle_bytes == 3 * 4096
    new, cls = pool.take(8192)
    pool.give(new, cls)  # does not fit: two idle 4 KiB blocks make room
    assert pool.idle_bytes == 4096 + 8192
    assert blocks.released == old[2:0:-1]  # the most recently given of the old class go first
    assert pool.take(8192)[0] == new


def test_a_block_over_the_budget_is_released_at_once() -> None:
    pool, blocks = pool_of(4096)
    big, cls = pool.take(10_000)
    pool.give(big, cls)
    assert blocks.released == [big] and pool.idle_bytes == 0


def test_a_class_in_use_several_at_a_time_takes_over_a_full_pool() -> None:
    """After the first round every take of the new class is served from the pool."""
    pool, blocks = pool_of(4 * 4096)
    for b in [pool.take(4096)[0] for _ in range(4)]:
        pool.give(b, 4096)
    for _ in range(20):
        pair = [pool.take(8192), pool.take(8192)]
        for b, cls in pair:
            pool.give(b, cls)
    assert [cls for _, cls in blocks.made].count(8192) == 2
    assert pool.idle_bytes == 2 * 8192


def test_clear_releases_every_idle_block() -> None:
    pool, blocks = pool_of(1 << 20)
    taken = [pool.take(n) for n in (100, 5000, 5000, 70_000)]
    for b, cls in taken:
        pool.give(b, cls)
    pool.clear()
    assert sorted(blocks.released) == sorted(b for b, _ in taken) and pool.idle_bytes == 0


def test_idle_bytes_stay_exact_under_threads() -> None:
    pool, blocks = pool_of(5 * 8192)
    sizes = [1500, 3000, 5000, 9000, 20000, 40000]

    def churn(seed: int) -> None:
        rng = np.random.default_rng(seed)
        held: list[tuple[Any, int]] = []
        for _ in range(3000):
            if held and rng.random() < 0.5:
                pool.give(*held.pop(int(rng.integers(len(held)))))
            else:
                held.append(pool.take(int(rng.choice(sizes))))
        for b, cls in held:
            pool.give(b, cls)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=churn, args=(seed,)) for seed in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    kept = pool.idle_blocks()
    idle = sum(cls * count for cls, count in kept.items())
    assert pool.idle_bytes == idle and 0 < idle <= pool.budget
    assert len(blocks.made) == len(blocks.released) + sum(kept.values())


# -- HostReceivePool -----------------------------------------------------------------------------------------


def test_a_received_array_is_a_view_of_a_pooled_block_that_comes_back() -> None:
    pool = HostReceivePool(min_bytes=1024, max_bytes=1 << 20)
    a = pool.take_array((5000,), np.dtype(np.uint8), 5000)
    assert (type(a), a.dtype, a.shape, a.flags.writeable) == (np.ndarray, np.dtype(np.uint8), (5000,), True)
    addr = a.ctypes.data
    a[:] = 7
    del a
    assert pool.idle_bytes == 8192  # back as soon as the last reference goes, no collection needed
    b = pool.take_array((6000,), np.dtype(np.uint8), 6000)
    assert b.ctypes.data == addr and pool.idle_bytes == 0


@pytest.mark.parametrize(
    ("shape", "dtype", "fortran"),
    [((8192,), np.uint8, False), ((64, 32), np.float32, False), ((64, 32), np.float32, True), ((3, 700), "V3", False)],
)
def test_the_block_stays_lent_until_the_last_view_dies(shape: tuple[int, ...], dtype: Any, fortran: bool) -> None:
    """Exact size classes too: numpy collapses view bases, so the lease must stay in every view's chain."""
    pool = HostReceivePool(min_bytes=1024, max_bytes=1 << 20)
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dt.itemsize
    a = pool.take_array(shape, dt, nbytes, fortran)
    assert (type(a), a.shape, a.dtype, a.flags.writeable) == (np.ndarray, shape, dt, True)
    assert a.flags.f_contiguous if fortran else a.flags.c_contiguous
    addr = a.ctypes.data
    views = [a[..., 1:], a.reshape(-1, order="A")[::2], a.T]
    del a
    gc.collect()
    for i in range(len(views)):
        assert pool.idle_bytes == 0  # a view still uses it
        views[i] = None  # type: ignore[call-overload]
    assert pool.idle_bytes > 0
    assert pool.take_array(shape, dt, nbytes, fortran).ctypes.data == addr


def test_sizes_outside_the_pooled_range_get_plain_arrays() -> None:
    pool = HostReceivePool(min_bytes=1024, max_bytes=8192)
    small = pool.take_array((100,), np.dtype(np.uint8), 100)
    big = pool.take_array((10000,), np.dtype(np.uint8), 10000)
    assert small.base is None and big.base is None
    del small, big
    assert pool.idle_bytes == 0


def test_a_full_pool_moves_on_to_the_size_in_use() -> None:
    """A run that moves on to a new size keeps pooling it once the budget is full."""
    pool = HostReceivePool(min_bytes=1024, max_bytes=1 << 20, budget=lambda: 3 * 4096)
    old = [pool.take_array((4096,), np.dtype(np.uint8), 4096) for _ in range(3)]
    del old
    assert pool.idle_bytes == 3 * 4096
    new = pool.take_array((8192,), np.dtype(np.uint8), 8192)
    addr = new.ctypes.data
    del new
    assert pool.idle_bytes == 4096 + 8192
    assert pool.take_array((8192,), np.dtype(np.uint8), 8192).ctypes.data == addr
    pool.clear()
    assert pool.idle_bytes == 0


def test_cai_mpi_pool_bytes_bounds_what_received_arrays_leave_idle() -> None:
    """CAI_MPI_POOL_BYTES is the budget of the process's pool of received arrays, re-read as settings are: 0 keeps
    nothing idle; a smaller budget takes effect as blocks come back."""
    pool = host_receive_pool()
    pool.clear()
    try:
        reload_config({"CAI_MPI_POOL_BYTES": "0"})
        a = pool.take_array((1 << 17,), np.dtype(np.uint8), 1 << 17)
        del a
        assert pool.idle_bytes == 0
        reload_config({"CAI_MPI_POOL_BYTES": str(1 << 18)})
        arrays = [pool.take_array((1 << 17,), np.dtype(np.uint8), 1 << 17) for _ in range(4)]
        del arrays
        assert pool.idle_bytes == 1 << 18  # two of the four blocks
        reload_config({})
        assert Config.from_env({}).pool_bytes == 1 << 30  # the default
    finally:
        reload_config()
        pool.clear()


def test_a_lowered_budget_trims_what_is_idle_as_blocks_come_back() -> None:
    """Blocks of one class fill the pool; the budget is lowered (a setting changed): the next block back leaves
    the pool within the new budget, whatever classes are idle, and a block over the budget is not kept."""
    budget = [8 * 4096]
    blocks = Blocks()
    pool = BlockPool(blocks.allocate, blocks.release, budget=lambda: budget[0])
    taken = [pool.take(4096) for _ in range(9)]
    for block, cls in taken[:8]:
        pool.give(block, cls)
    assert pool.idle_bytes == 8 * 4096
    budget[0] = 2 * 4096
    block, cls = taken[8]
    pool.take(100)  # (a budget is read when a block is taken)
    pool.give(block, cls)
    assert pool.idle_bytes == 2 * 4096 and len(blocks.released) == 7
    budget[0] = 0
    big, big_cls = pool.take(1 << 20)
    pool.give(big, big_cls)
    assert pool.idle_bytes == 0 and big in blocks.released


# -- staging blocks a transfer may still use: quarantined until MPI and the GPU are done with them ---------------


class StepEvent:
    """A device event that has completed once it has been asked ``busy_for`` times; the query that finds it done
    runs ``on_done`` first, as an allocation inside a query may run the garbage collector, and with it the finalizer
    of a dead transfer that gives its own staging block back."""

    def __init__(self, busy_for: int, on_done: Any = None) -> None:
        self.left, self.on_done = busy_for, on_done

    def query(self) -> bool:
        self.left -= 1
        if self.left > 0:
            return False
        if self.on_done is not None:
            on_done, self.on_done = self.on_done, None
            on_done()
        return True


def test_a_block_given_back_while_quarantined_blocks_are_released_does_not_hang() -> None:
    """Issue 44: no finalizer may take a lock that code holding it reaches through an allocation. Releasing the
    quarantined blocks queries their events; a collection there may finalize a transfer that gives its block back."""
    from cai_mpi._src.runtime import get_runtime
    from cai_mpi._src.transport.pool import give_back, pinned_pool

    rt = get_runtime()
    pool: Any
    pool, _ = pool_of(1 << 20)  # (blocks of a stand-in allocator: the quarantine is the same for any pool)
    first, cls = pool.take(4096)
    second, _ = pool.take(4096)
    # the second block comes back from inside the release of the first, and is still busy itself
    give_back(pool, first, cls, [], [StepEvent(2, lambda: give_back(pool, second, cls, [], [StepEvent(2)]))])
    before = pool.idle_bytes
    done = threading.Event()

    def release() -> None:
        pinned_pool(rt)  # (releases the quarantined blocks whose transfers have finished)
        done.set()

    worker = threading.Thread(target=release, daemon=True)
    worker.start()
    assert done.wait(5), "releasing quarantined blocks hung when a block came back meanwhile"
    assert pool.idle_bytes == before + cls  # the first is back; the second is still in use
    pinned_pool(rt)
    assert pool.idle_bytes == before + 2 * cls  # and then the second
    gc.collect()
