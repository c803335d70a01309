"""Releasing device Arrays exported through DLPack: the deleter never hangs when releasing one export releases
another, or when the collector runs it in the middle of another export, and a consumer's stream is waited for
before the Array's block is used again."""

from __future__ import annotations

import ctypes
import gc
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cai_mpi._src.arrays import dlpack
from cai_mpi._src.core.descriptor import CAIDescriptor
from cai_mpi._src.runtime.host import HostRuntime

HANG = 30.0  # seconds after which a call that should return at once is declared hung (only a failure waits this)

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype, _get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
_set_name = ctypes.pythonapi.PyCapsule_SetName
_set_name.restype, _set_name.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
_USED = b"used_dltensor"  # (a module constant: the capsule keeps the name's address)


def finishes(fn: Callable[[], Any], within: float = HANG) -> bool:
    """Whether ``fn()`` returns within ``within`` seconds; run in a thread, so a deadlock fails instead of hanging."""
    worker = threading.Thread(target=fn, daemon=True)
    worker.start()
    worker.join(within)
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


class CollectingDict(dict):  # type: ignore[type-arg]
    """``dlpack._alive`` that runs the collector as an entry is stored: the moment an export records its tensor."""

    def __setitem__(self, key: Any, value: Any) -> None:
        gc.collect()
        super().__setitem__(key, value)


def test_an_export_collected_while_another_export_is_recorded_does_not_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    # A dead export in a reference cycle (an unconsumed capsule the collector frees) runs the deleter at whatever
    # allocation the collector interrupts: here, the next export storing its entry.
    monkeypatch.setattr(dlpack, "_alive", CollectingDict(dlpack._alive))
    gc.disable()
    try:
        dead = [capsule_of(object())]
        dead.append(dead)  # type: ignore[arg-type]  # only the collector frees it
        del dead
        made: list[Any] = []
        done = finishes(lambda: made.append(capsule_of(object())))
        if not done:  # (the old lock: let the hung thread go, so that the assertion is the test's only outcome)
            dlpack._alive_lock.release()  # type: ignore[attr-defined]
        assert done
        made.clear()
    finally:
        gc.enable()
    assert not dlpack._alive
