"""Memory of the CUDA driver double: device allocations the host cannot touch, pinned host memory, pointers."""

from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import threading
from typing import Any

from ._cuda_streams import Stream
from ._cuda_types import (
    MAP_FAILED,
    PAGE,
    Block,
    CUcontext,
    CUdeviceptr,
    CUmemorytype,
    CUpointer_attribute,
    CUresult,
    libc,
    value,
)

__all__ = ["Memory"]


class Memory:
    """The memory calls of the double (mixed into ``CudaDriverDouble``)."""

    host_accessible: bool
    ordinal_bug: bool
    reuse_internal_dependencies: bool
    _lock: threading.RLock
    _blocks: dict[int, Block]
    _starts: list[int]
    pinned_bytes_outstanding: int
    pinned_bytes_peak: int
    pinned_allocations: int
    _graveyard: list[Block]
    _pool: list[tuple[Block, Stream, Any]]
    CU_MEMHOSTALLOC_DEVICEMAP: int

    def _enter(self, name: str, *, needs_init: bool = True, needs_context: bool = False) -> CUresult | None:
        raise NotImplementedError

    def _current(self) -> int:
        raise NotImplementedError

    def ordinal_of(self, context: int) -> int:
        raise NotImplementedError

    def _stream(self, handle: Any) -> Stream | None:
        raise NotImplementedError

    def _implicit(self, stream: Stream) -> list[Any]:
        raise NotImplementedError

    def _out_of_device_memory(self, nbytes: int) -> bool:
        raise NotImplementedError

    def _give_back(self, block: Block) -> None:
        raise NotImplementedError

    def _out_of_pinned_memory(self, nbytes: int) -> bool:
        raise NotImplementedError


    def _map(self, fd: int, nbytes: int, prot: int) -> int:
        address = libc.mmap(None, nbytes, prot, mmap.MAP_SHARED, fd, 0)
        if address in (None, MAP_FAILED):
            raise OSError(ctypes.get_errno(), "mmap failed in the CUDA driver double")
        return int(address)

    def _register(self, block: Block) -> None:
        with self._lock:
            self._blocks[block.address] = block
            bisect.insort(self._starts, block.address)

    def _unregister(self, address: int) -> Block | None:
        with self._lock:
            block = self._blocks.pop(address, None)
            if block is not None:
                self._starts.remove(address)
            return block

    def _find(self, address: int) -> Block | None:
        """The allocation ``address`` falls into (its start, or any byte of it)."""
        with self._lock:
            i = bisect.bisect_right(self._starts, address) - 1
            if i < 0:
                return None
            block = self._blocks[self._starts[i]]
            return block if address < block.address + max(block.nbytes, 1) else None

    def _past_the_end(self, address: int, nbytes: int) -> str | None:
        """Why ``nbytes`` at ``address`` are not all inside the allocation whose pages they start in (the double maps
        whole pages, so the bytes past an allocation's end would read and write without a fault), or None."""
        if nbytes <= 0:
            return None
        with self._lock:
            i = bisect.bisect_right(self._starts, address) - 1
            block = self._blocks[self._starts[i]] if i >= 0 else None
        mapped = (block.maps[0][1] if block.maps else _capacity_for(block.nbytes)) if block is not None else 0
        if block is None or address >= block.address + mapped:
            return None  # memory the double did not allocate (pageable host memory)
        if address + nbytes <= block.address + block.nbytes:
            return None
        return (f"{nbytes} bytes at {address:#x} run past the end of the {block.nbytes}-byte {block.kind} allocation "
                f"at {block.address:#x}")

    def _device_block(self, nbytes: int, kind: str) -> Block:
        size = max(-(-nbytes // PAGE) * PAGE, PAGE)
        fd = os.memfd_create("cuda-driver-double", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        rw = mmap.PROT_READ | mmap.PROT_WRITE
        twin = self._map(fd, size, rw)
        exposed = rw if (self.host_accessible or kind == "managed") else 0  # PROT_NONE: the host faults
        address = self._map(fd, size, exposed)
        ctx = self._current()
        return Block(kind, address, twin, nbytes, self.ordinal_of(ctx), ctx, fd=fd,
                      maps=((address, size), (twin, size)))

    def _finish_device_work(self) -> None:
        """Wait for the work enqueued on every stream (the calling worker's own aside: a finalizer may run there)."""
        me = threading.current_thread()
        for stream in self._all_streams():  # type: ignore[attr-defined]
            if not stream.runs_in(me):
                stream.tail.wait()

    def _drop(self, block: Block) -> None:
        for address, size in block.maps:
            libc.munmap(address, size)
        if block.fd >= 0:
            os.close(block.fd)

    def _bury(self, block: Block) -> None:
        """Forget a freed block at once (no implicit synchronization); unmap it once no stream has work queued, so
        work still using it reads or writes a dead allocation, as on a GPU, instead of crashing the test process."""
        self._unregister(block.address)
        with self._lock:
            self._graveyard.append(block)
            idle = all(s.tail.is_set() for s in self._all_streams())  # type: ignore[attr-defined]
            buried = self._graveyard[:-1] if not idle else self._graveyard[:]
            if idle:
                self._graveyard.clear()
        if idle:
            for dead in buried:
                self._drop(dead)

    def cuMemAlloc(self, bytesize: int) -> tuple[CUresult, CUdeviceptr | None]:
        failure = self._enter("cuMemAlloc", needs_context=True)
        if failure is None and not self._reserve(int(bytesize)):
            failure = CUresult.CUDA_ERROR_OUT_OF_MEMORY
        if failure:
            return failure, None
        block = self._device_block(int(bytesize), "device")
        self._register(block)
        return CUresult.CUDA_SUCCESS, CUdeviceptr(block.address)

    def cuMemAllocManaged(self, bytesize: int, flags: int) -> tuple[CUresult, CUdeviceptr | None]:
        failure = self._enter("cuMemAllocManaged", needs_context=True)
        if failure is None and not self._reserve(int(bytesize)):
            failure = CUresult.CUDA_ERROR_OUT_OF_MEMORY
        if failure:
            return failure, None
        block = self._device_block(int(bytesize), "managed")
        self._register(block)
        return CUresult.CUDA_SUCCESS, CUdeviceptr(block.address)

    def cuMemFree(self, dptr: Any) -> tuple[CUresult]:
        """Frees at once: CUDA documents no implicit synchronization for stream-ordered allocations and only a
        possible one for the others, so the double waits for nothing (work still using the memory is a bug)."""
        failure = self._enter("cuMemFree", needs_context=True)
        if failure is None:
            block = self._blocks.get(value(dptr))
            if block is None or block.kind not in ("device", "managed", "async"):
                failure = CUresult.CUDA_ERROR_INVALID_VALUE
            else:
                self._bury(block)
                self._give_back(block)
        return (failure or CUresult.CUDA_SUCCESS,)

    def cuMemAllocAsync(self, bytesize: int, hStream: Any) -> tuple[CUresult, CUdeviceptr | None]:
        """Stream-ordered allocation from the device's default pool, which caches freed blocks as CUDA's (and
        CuPy's) pools do: a block freed on ``hStream`` is handed to the next allocation on ``hStream`` at once (the
        stream order makes that safe for work on that stream alone); a block freed on another stream once its free
        has run (CUDA's opportunistic reuse), or, while ``reuse_internal_dependencies`` (CUDA's default
        ``CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES``), at once, with ``hStream`` made to wait for that free:
        work on ``hStream`` is ordered after the block's previous user's, but a write from the host (a CUDA-aware
        MPI's) is not, and the previous user's pending work lands after it. Preferred in that order."""
        failure = self._enter("cuMemAllocAsync", needs_context=True)
        stream = None if failure else self._stream(hStream)
        if failure or stream is None:
            return failure or CUresult.CUDA_ERROR_INVALID_HANDLE, None
        nbytes = int(bytesize)
        ctx = self._current()
        with self._lock:
            fitting = [(i, 2 if freed_on is stream else int(freed.is_set()))
                       for i, (block, freed_on, freed) in enumerate(self._pool)
                       if block.context == ctx and _capacity(block) == _capacity_for(nbytes)
                       and (freed_on is stream or freed.is_set() or self.reuse_internal_dependencies)]
            if fitting:  # this stream's own blocks first, as CuPy's per-stream free lists
                i, rank = max(fitting, key=lambda f: f[1])
                block, _freed_on, freed = self._pool.pop(i)  # (same pages: the memory counted stays ``reserved``)
                if rank == 0:  # the dependency the driver inserts into the allocating stream
                    stream.enqueue(lambda: None, [freed, *self._implicit(stream)])
                block.nbytes = nbytes
                self._register(block)
                return CUresult.CUDA_SUCCESS, CUdeviceptr(block.address)
        if not self._reserve(nbytes):
            return CUresult.CUDA_ERROR_OUT_OF_MEMORY, None
        block = self._device_block(nbytes, "async")
        self._register(block)
        return CUresult.CUDA_SUCCESS, CUdeviceptr(block.address)

    def _reserve(self, nbytes: int) -> bool:
        """Reserve ``nbytes`` of the current device; the pool's idle blocks count as in use, so they are given back
        to the device first when the bytes do not fit."""
        if not self._out_of_device_memory(nbytes):
            return True
        self._release_idle_pool_blocks(self._current())
        return not self._out_of_device_memory(nbytes)

    def _release_idle_pool_blocks(self, ctx: int) -> None:
        """Give the device the pool's blocks of context ``ctx`` whose free has run (as a pool does before it
        reports out of memory)."""
        with self._lock:
            idle = [entry for entry in self._pool if entry[0].context == ctx and entry[2].is_set()]
            for entry in idle:
                self._pool.remove(entry)
        for block, _stream, _freed in idle:
            self._give_back(block)
            self._drop(block)

    def cuMemFreeAsync(self, dptr: Any, hStream: Any) -> tuple[CUresult]:
        """Stream-ordered free: the block goes back to the pool now, for reuse as ``cuMemAllocAsync`` says."""
        failure = self._enter("cuMemFreeAsync", needs_context=True)
        stream = None if failure else self._stream(hStream)
        block = self._blocks.get(value(dptr))
        if failure is None and (stream is None or block is None or block.kind != "async"):
            failure = CUresult.CUDA_ERROR_INVALID_VALUE
        if failure is None:
            assert stream is not None and block is not None
            freed = stream.enqueue(lambda: None, self._implicit(stream))
            self._unregister(block.address)
            with self._lock:
                self._pool.append((block, stream, freed))
        return (failure or CUresult.CUDA_SUCCESS,)

    def cuMemHostAlloc(self, bytesize: int, Flags: int) -> tuple[CUresult, int | None]:
        failure = self._enter("cuMemHostAlloc", needs_context=True)
        if failure is None and self._out_of_pinned_memory(int(bytesize)):
            failure = CUresult.CUDA_ERROR_OUT_OF_MEMORY
        if failure:
            return failure, None
        nbytes = int(bytesize)
        size = max(-(-nbytes // PAGE) * PAGE, PAGE)
        fd = os.memfd_create("cuda-driver-double-pinned", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        host = self._map(fd, size, mmap.PROT_READ | mmap.PROT_WRITE)
        maps: tuple[tuple[int, int], ...] = ((host, size),)
        ctx = self._current()
        block = Block("pinned", host, host, nbytes, self.ordinal_of(ctx), ctx, host=host, fd=fd)
        if int(Flags) & self.CU_MEMHOSTALLOC_DEVICEMAP:
            exposed = mmap.PROT_READ | mmap.PROT_WRITE if self.host_accessible else 0
            alias = self._map(fd, size, exposed)
            maps += ((alias, size),)
            block.alias = alias
            self._register(Block("alias", alias, host, nbytes, block.ordinal, ctx, host=host))
        block.maps = maps
        self._register(block)
        with self._lock:
            self.pinned_bytes_outstanding += nbytes
            self.pinned_bytes_peak = max(self.pinned_bytes_peak, self.pinned_bytes_outstanding)
            self.pinned_allocations += 1
        return CUresult.CUDA_SUCCESS, host

    def cuMemFreeHost(self, p: Any) -> tuple[CUresult]:
        failure = self._enter("cuMemFreeHost")
        block = self._blocks.get(value(p))
        if failure is None and (block is None or block.kind != "pinned"):
            failure = CUresult.CUDA_ERROR_INVALID_VALUE
        if failure is None:
            assert block is not None
            self._finish_device_work()  # (lenient: the double's own copies read pinned memory it would unmap)
            self._unregister(block.address)
            if block.alias:
                self._unregister(block.alias)
            self._drop(block)
            with self._lock:
                self.pinned_bytes_outstanding -= block.nbytes
                self.pinned_allocations -= 1
        return (failure or CUresult.CUDA_SUCCESS,)

    def cuMemHostGetDevicePointer(self, p: Any, Flags: int) -> tuple[CUresult, CUdeviceptr | None]:
        failure = self._enter("cuMemHostGetDevicePointer", needs_context=True)
        block = self._find(value(p))
        if failure is None and (block is None or block.kind != "pinned"):
            failure = CUresult.CUDA_ERROR_INVALID_VALUE
        if failure:
            return failure, None
        assert block is not None
        offset = value(p) - block.address
        return CUresult.CUDA_SUCCESS, CUdeviceptr((block.alias or block.address) + offset)

    def _pointer_values(self, block: Block | None, ptr: int) -> dict[int, Any]:
        """Every attribute of ``ptr`` as the driver knows it (the bindings' reading is applied later)."""
        a = CUpointer_attribute
        if block is None:
            return {
                a.CU_POINTER_ATTRIBUTE_MEMORY_TYPE: 0, a.CU_POINTER_ATTRIBUTE_IS_MANAGED: False,
                a.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: -2, a.CU_POINTER_ATTRIBUTE_HOST_POINTER: 0,
                a.CU_POINTER_ATTRIBUTE_DEVICE_POINTER: CUdeviceptr(0), a.CU_POINTER_ATTRIBUTE_CONTEXT: CUcontext(0),
                a.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: CUdeviceptr(0), a.CU_POINTER_ATTRIBUTE_RANGE_SIZE: 0,
                a.CU_POINTER_ATTRIBUTE_MAPPED: False,
            }
        offset = ptr - block.address
        on_host = block.kind in ("pinned", "alias")
        memory_type = CUmemorytype.CU_MEMORYTYPE_HOST if on_host else CUmemorytype.CU_MEMORYTYPE_DEVICE
        device_pointer = (block.alias or block.address) if block.kind == "pinned" else block.address
        # Stream-ordered allocations belong to a memory pool, not a context: CUDA documents CONTEXT as NULL.
        context = 0 if block.kind == "async" else block.context
        return {
            a.CU_POINTER_ATTRIBUTE_MEMORY_TYPE: int(memory_type),
            a.CU_POINTER_ATTRIBUTE_IS_MANAGED: block.kind == "managed",
            a.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: block.ordinal,
            a.CU_POINTER_ATTRIBUTE_HOST_POINTER: (block.host + offset) if on_host else 0,
            a.CU_POINTER_ATTRIBUTE_DEVICE_POINTER: CUdeviceptr(device_pointer + offset),
            a.CU_POINTER_ATTRIBUTE_CONTEXT: CUcontext(context),
            a.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: CUdeviceptr(block.address),
            a.CU_POINTER_ATTRIBUTE_RANGE_SIZE: block.nbytes,
            a.CU_POINTER_ATTRIBUTE_MAPPED: True,
        }

    def _pointer_query(self, block: Block | None, attributes: list[int]) -> CUresult | None:
        """Why a query of ``attributes`` fails in the calling thread's context, or None.

        UVA lets any context ask where memory lives (type, context, ordinal). With no context current a query
        fails: CUDA documents INVALID_CONTEXT for DEVICE_POINTER, and cudaPointerGetAttributes failed so until
        CuPy made a context current first (cupy/cupy#3991); the double refuses every query then. Device memory
        of another GPU has no DEVICE_POINTER in the asking context: INVALID_VALUE, documented for
        cuPointerGetAttribute and applied to the bulk query too (peer access is not modelled).
        """
        current = self._current()
        if not current:
            return CUresult.CUDA_ERROR_INVALID_CONTEXT
        foreign = block is not None and block.kind in ("device", "async") and block.ordinal != self.ordinal_of(current)
        if foreign and int(CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_POINTER) in attributes:
            return CUresult.CUDA_ERROR_INVALID_VALUE
        return None

    def _as_read(self, attribute: int, answer: Any) -> Any:
        """The value as the Python bindings hand it back: ``ordinal_bug`` reads DEVICE_ORDINAL from a field
        never written, so every pointer reports 0 (cuda-bindings 12.9.6-12.9.8, 13.1.2-13.4.2)."""
        if self.ordinal_bug and attribute == int(CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL):
            return 0
        return answer

    def cuPointerGetAttribute(self, attribute: CUpointer_attribute, ptr: Any) -> tuple[CUresult, Any]:
        attribute.value  # noqa: B018  (a plain int raises AttributeError, as in cuda-bindings)
        failure = self._enter("cuPointerGetAttribute")
        block = self._find(value(ptr))
        if failure is None and block is None:
            failure = CUresult.CUDA_ERROR_INVALID_VALUE  # memory CUDA does not know
        failure = failure or self._pointer_query(block, [int(attribute)])
        if failure is None and attribute == CUpointer_attribute.CU_POINTER_ATTRIBUTE_HOST_POINTER:
            assert block is not None
            if block.kind in ("device", "async"):
                failure = CUresult.CUDA_ERROR_INVALID_VALUE  # device memory has no host address
        if failure:
            return failure, None
        answer = self._pointer_values(block, value(ptr))[int(attribute)]
        return CUresult.CUDA_SUCCESS, self._as_read(int(attribute), answer)

    def cuPointerGetAttributes(
        self, numAttributes: int, attributes: list[CUpointer_attribute] | tuple[CUpointer_attribute, ...], ptr: Any
    ) -> tuple[CUresult, list[Any] | None]:
        typed = isinstance(attributes, (list, tuple)) and all(isinstance(a, CUpointer_attribute) for a in attributes)
        if not typed:
            raise TypeError("Argument 'attributes' is not instance of type (expected "
                            "tuple[cydriver.CUpointer_attribute] or list[cydriver.CUpointer_attribute]")
        asked = [int(a) for a in attributes[: int(numAttributes)]]
        block = self._find(value(ptr))
        failure = self._enter("cuPointerGetAttributes") or self._pointer_query(block, asked)
        if failure:
            return failure, None
        values = self._pointer_values(block, value(ptr))  # unknown memory: NULL values and success, as documented
        return CUresult.CUDA_SUCCESS, [self._as_read(a, values[a]) for a in asked]


def _capacity_for(nbytes: int) -> int:
    return max(-(-nbytes // PAGE) * PAGE, PAGE)


def _capacity(block: Block) -> int:
    return block.maps[0][1]
