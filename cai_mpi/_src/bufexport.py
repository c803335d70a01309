"""The base class that gives ``cai_mpi.Array`` the Python buffer protocol.

A subclass defines ``_host_buffer_target(self)``, returning an object that exports the
buffer protocol (a numpy array of the host memory) or raising ``BufferError`` (device
memory). ``memoryview(obj)``, ``bytes(obj)`` and ``np.frombuffer(obj)`` then see that
object's buffer, zero-copy, with its format, shape, strides and read-only flag.

The base also holds ``cai_mpi.Array``'s fields and its ``_received_host`` constructor (one C call
per received message instead of seven slot stores).

``BufferExporterBase`` is the C type from ``_bufexport`` when that extension was built
(any Python >= 3.10), else the pure-Python :class:`PyBufferExporter`, whose PEP 688
``__buffer__`` works on Python >= 3.12 only: on older Pythons without the extension
instances simply do not export a buffer. ``HAVE_C_BUFFER_EXPORT`` tells which.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TypeVar

__all__ = ["HAVE_C_BUFFER_EXPORT", "HAVE_BUFFER_EXPORT", "BufferExporterBase", "PyBufferExporter"]


_E = TypeVar("_E", bound="PyBufferExporter")


class PyBufferExporter:
    """Pure-Python fallback for the C ``BufferExporter`` (buffer export on Python >= 3.12).

    Like the C type it holds ``cai_mpi.Array``'s fields and builds received host Arrays.
    """

    __slots__ = ("__dict__", "__weakref__", "_descriptor", "_host", "_owner", "device", "meta", "source", "tag")
    _descriptor: Any
    _host: Any
    _owner: Any
    device: Any
    meta: Any
    source: Any
    tag: Any

    @classmethod
    def _received_host(cls: type[_E], host: Any, source: Any, tag: Any) -> _E:
        """A new instance holding host memory just received (no descriptor or meta yet)."""
        self = cls.__new__(cls)
        self._descriptor = self.meta = None
        self.device = "host"
        self.source = source
        self.tag = tag
        self._owner = self._host = host
        return self

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
