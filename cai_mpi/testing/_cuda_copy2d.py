"""The CUDA driver double's 2-D copies: which ``CUDA_MEMCPY2D`` descriptions CUDA refuses, and the rows of the others.

The limits are the ones the CUDA driver API documents for ``cuMemcpy2D``/``cuMemcpy2DAsync`` (CUDA driver API,
Memory Management; the same text is the docstring of ``cuda.bindings.driver.cuMemcpy2DAsync``):

- "srcPitch must be greater than or equal to WidthInBytes + srcXInBytes, and dstPitch must be greater than or
  equal to WidthInBytes + dstXInBytes" (so a pitch of 0, a broadcast row, is refused; a negative pitch cannot even
  be written into the struct, whose pitches are ``size_t``);
- "cuMemcpy2DAsync() returns an error if any pitch is greater than the maximum allowed
  (CU_DEVICE_ATTRIBUTE_MAX_PITCH)";
- "On intra-device memory copies (device to device, CUDA array to device, CUDA array to CUDA array),
  cuMemcpy2DAsync() may fail for pitches not computed by cuMemAllocPitch()": the double has no cuMemAllocPitch, so
  it refuses every 2-D copy from device memory to device memory, the strictest reading of "may fail".

Each refusal is ``CUDA_ERROR_INVALID_VALUE``, as on hardware, and copies nothing. The double models no CUDA arrays,
so ``CU_MEMORYTYPE_ARRAY`` is refused too, as is a memory type never set (0 in the real struct).
"""

from __future__ import annotations

from collections.abc import Callable

from ._cuda_types import CUDA_MEMCPY2D, CUmemorytype, value

__all__ = ["MAX_PITCH", "copy_2d_rows", "refusal_2d"]

MAX_PITCH = (1 << 31) - 1  # CU_DEVICE_ATTRIBUTE_MAX_PITCH as current NVIDIA GPUs report it


def _side(c: CUDA_MEMCPY2D, side: str) -> tuple[CUmemorytype | None, int, int, int, int]:
    """(memory type, base address, X offset, Y offset, pitch) of ``side`` ("src" or "dst")."""
    kind = c._memory_types()[0 if side == "src" else 1]
    host = kind is CUmemorytype.CU_MEMORYTYPE_HOST
    base = value(getattr(c, f"{side}Host" if host else f"{side}Device"))
    return kind, base, getattr(c, f"{side}XInBytes"), getattr(c, f"{side}Y"), getattr(c, f"{side}Pitch")


def refusal_2d(c: CUDA_MEMCPY2D, max_pitch: int, is_device_memory: Callable[[int], bool]) -> str | None:
    """Why CUDA refuses the copy ``c`` (CUDA_ERROR_INVALID_VALUE), or None when it is one CUDA documents as valid.

    ``is_device_memory(address)``: whether a unified address is device memory (the driver looks it up).
    """
    width = c.WidthInBytes
    on_device = []
    for side in ("src", "dst"):
        kind, base, x, _y, pitch = _side(c, side)
        if kind is None:
            return f"{side}MemoryType is no CUmemorytype (never set?)"
        if kind is CUmemorytype.CU_MEMORYTYPE_ARRAY:
            return f"{side}MemoryType is CU_MEMORYTYPE_ARRAY: the double models no CUDA arrays"
        if pitch < width + x:
            return f"{side}Pitch {pitch} is less than WidthInBytes {width} + {side}XInBytes {x}"
        if pitch > max_pitch:
            return f"{side}Pitch {pitch} is greater than CU_DEVICE_ATTRIBUTE_MAX_PITCH {max_pitch}"
        device = kind is CUmemorytype.CU_MEMORYTYPE_DEVICE
        on_device.append(device or (kind is CUmemorytype.CU_MEMORYTYPE_UNIFIED and is_device_memory(base)))
    if all(on_device):
        return "an intra-device 2-D copy with pitches cuMemAllocPitch did not give (CUDA documents it may fail)"
    return None


def copy_2d_rows(c: CUDA_MEMCPY2D) -> list[tuple[int, int]]:
    """``(destination, source)`` address of each row of a copy ``refusal_2d`` accepts."""
    _k, src, sx, sy, spitch = _side(c, "src")
    _k, dst, dx, dy, dpitch = _side(c, "dst")
    src, dst = src + sx + sy * spitch, dst + dx + dy * dpitch
    return [(dst + r * dpitch, src + r * spitch) for r in range(c.Height)]
