"""Releasing device Arrays exported through DLPack: the deleter never hangs when releasing one export releases
another, and a consumer's stream is waited for before the Array's block is used again."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from cai_mpi._src.arrays import dlpack
from cai_mpi._src.core.descriptor import CAIDescriptor
from cai_mpi._src.runtime.host import HostRuntime

HANG = 30.0  # seconds after which a call that should return at once is declared hung (only a failure waits this)

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype, _get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
_set_name = ctypes.pythonapi.PyCapsule_SetName
_set_name.restype, _set_name.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
_USED = b"used_dltensor"  # (a module constant: the capsule keeps the name's address)


def finishes(fn: Callable[[], Any]) -> bool:
    """Whether ``fn()`` returns within ``HANG`` seconds; run in a thread, so a deadlock fails instead of hanging."""
    worker = threading.Thread(target=fn, daemon=True)
    worker.start()
    worker.join(HANG)
    return not worker.is_alive()


class Adopted:
    """What ``torch.from_dlpack(capsule)`` makes: it takes the tensor (renames the capsule ``used_...``) and calls
    the tensor's deleter when it dies."""

    def __init__(self, capsule: Any) -> None:
        self.address = _get_pointer(capsule, b"dltensor")
        assert _set_name(capsule, _USED) == 0

    def __del__(self) -> None:
        dlpack.DLManagedTensor.from_address(self.address).deleter(self.address)


class Holder:
    """An Array received into ``out=`` an adopted tensor: it keeps the tensor alive."""

    def __init__(self, tensor: Adopted) -> None:
        self.tensor = tensor


def capsule_of(owner: Any) -> Any:
    desc = CAIDescriptor.for_new_buffer(0x10000, (4,), np.dtype("f8"))
    return dlpack.device_capsule(owner, desc, 0, versioned=False, runtime=HostRuntime(), stream=-1)


def test_releasing_an_export_that_holds_another_export_does_not_hang() -> None:
    # recv_array(out=torch.from_dlpack(a)) gives an Array b that owns the tensor adopted from a's export; when b's
    # own export is released, dropping b drops the tensor, whose deleter releases a's export on the same thread.
    def chain() -> None:
        tensor = Adopted(capsule_of(object()))
        exported = capsule_of(Holder(tensor))
        del tensor
        del exported  # never consumed: its destructor runs the deleter

    assert finishes(chain)
    assert not dlpack._alive
