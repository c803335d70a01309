"""The base class that gives ``cai_mpi.Array`` the Python buffer protocol.

A subclass defines ``_host_buffer_target(self)``, returning an object that exports the
buffer protocol (a numpy array of the host memory) or raising ``BufferError`` (device
memory). ``memoryview(obj)``, ``bytes(obj)`` and ``np.frombuffer(obj)`` then see that
object's buffer, zero-copy, with its format, shape, strides and read-only flag.

``BufferExporterBase`` is the C type from ``_bufexport`` when that extension was built
(any Python >= 3.10), else the pure-Python :class:`PyBufferExporter`, whose PEP 688
``__buffer__`` works on Python >= 3.12 only: on older Pythons without the extension
instances simply do not export a buffer. ``HAVE_C_BUFFER_EXPORT`` tells which.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

__all__ = ["HAVE_C_BUFFER_EXPORT", "HAVE_BUFFER_EXPORT", "BufferExporterBase", "PyBufferExporter"]


class PyBufferExporter:
    """Pure-Python fallback for the C ``BufferExporter`` (buffer export on Python >= 3.12)."""

    def _host_buffer_target(self) -> Any:
        """The object whose buffer ``self`` exports; override. The default raises BufferError."""
        raise BufferError(f"{type(self).__qualname__} does not export a host buffer")

    def __buffer__(self, flags: int, /) -> memoryview:
        target = self._host_buffer_target()
        if target is self:
            raise BufferError("_host_buffer_target() returned the exporter itself")
        return memoryview(target)


if TYPE_CHECKING:
    BufferExporterBase = PyBufferExporter
    HAVE_C_BUFFER_EXPORT: bool
else:
    try:
        from ._bufexport import BufferExporter as BufferExporterBase
    except ImportError:
        BufferExporterBase = PyBufferExporter
        HAVE_C_BUFFER_EXPORT = False
    else:
        HAVE_C_BUFFER_EXPORT = True

#: True where instances of ``BufferExporterBase`` subclasses export the buffer protocol.
HAVE_BUFFER_EXPORT: bool = HAVE_C_BUFFER_EXPORT or sys.version_info >= (3, 12)
