"""The bad-input cases of docs/reliability.md: each a call that must fail with a clear error and leave the
communicator in step. One list, used twice: ``tests/unit/test_bad_input_table.py`` runs every case on a rank
sending to itself and writes the table (error type and message) into the docs, and
``tests/mpi/test_bad_input_mpi.py`` runs every case between two ranks.

A case is made on one side of a message:

- ``send``: ``call(peer, tag)`` is a bad send; nothing may be sent.
- ``recv``: the sender first sends ``SENT`` (below), then ``call(peer, tag)`` is a bad receive. With
  ``consumed`` the bad receive matched that message and must have received and dropped its payload (an
  ``out=`` that does not fit); without, it must have refused before matching anything, so the next receive
  gets ``SENT`` intact.

After each case the next good message on the same communicator must arrive intact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from mpi4py import MPI
from numpy.lib.stride_tricks import as_strided

import cai_mpi
from cai_mpi.testing import FakeCudaArray

__all__ = ["CASES", "GROUPS", "POINTERS", "SENT", "BadInput", "FailingExporter", "good_message", "nested"]

#: What a receive-side case's sender sends: 256 KiB, over any eager limit and the inline size, so its payload
#: travels as a message of its own (a sender whose payload nobody drains would then never complete).
SENT = np.full(32768, -1.0)


def good_message(index: int) -> np.ndarray[Any, Any]:
    """The good message after case ``index``: unlike ``SENT`` and unlike any other case's."""
    return np.arange(1000, dtype=np.int64) + 1_000_000 * (index + 1)


@dataclasses.dataclass(frozen=True)
class BadInput:
    """One bad input: ``what`` is wrong (the table's first column, markdown), the ``error`` it raises, and the
    ``call(peer, tag)`` that provokes it on the ``side`` of a message (see the module docstring)."""

    group: str
    what: str
    error: type[Exception]
    side: Literal["send", "recv"]
    call: Callable[[int, int], object]
    consumed: bool = False


class Exporter:
    """A plain object exporting a CAI dict as given (real exporters' mistakes, made on purpose)."""

    def __init__(self, cai: Any, memory: Any = None) -> None:
        self.__cuda_array_interface__ = cai
        self.memory = memory  # keeps the memory the dict's pointer addresses alive


#: Every address a case's memory has: no message may show one (the table must not change from run to run).
POINTERS: set[int] = set()


def _fake(data: Any, **kw: Any) -> FakeCudaArray:
    fake = FakeCudaArray(data, **kw)
    POINTERS.add(fake.ptr)
    return fake


def _exporter(**changes: Any) -> Exporter:
    """A valid v3 dict of a (2, 3) float32 array over real (host) memory, with ``changes`` applied; a change
    to ``_DROP`` removes the key."""
    fake = _fake(np.arange(6, dtype="<f4").reshape(2, 3))
    cai = dict(fake.__cuda_array_interface__)
    for key, value in changes.items():
        if value is _DROP:
            del cai[key]
        else:
            cai[key] = value
    return Exporter(cai, fake)


_DROP = object()
_X = np.arange(6, dtype="<f4").reshape(2, 3)


class FailingExporter:
    """An exporter whose ``__cuda_array_interface__`` property raises (a freed buffer, a lost device)."""

    @property
    def __cuda_array_interface__(self) -> Any:
        raise RuntimeError("the buffer was freed")


def nested(levels: int) -> dict[str, Any]:
    """A meta dict holding lists nested ``levels`` deep: two bytes of JSON per level."""
    inner: Any = []
    for _ in range(levels - 1):
        inner = [inner]
    return {"a": inner}


def _send_cai(**changes: Any) -> Callable[[int, int], object]:
    return lambda peer, tag: cai_mpi.send_array(_exporter(**changes), peer, tag)


def _send(obj: Any, **kw: Any) -> Callable[[int, int], object]:
    """``send_array(obj, peer, tag, ...)``; a keyword ``dest`` or ``tag`` replaces the good one."""
    return lambda peer, tag: cai_mpi.send_array(obj, **{"dest": peer, "tag": tag, **kw})


def _recv(**kw: Any) -> Callable[[int, int], object]:
    """``recv_array(peer, tag, ...)``; a keyword ``source`` or ``tag`` replaces the good one."""

    def call(peer: int, tag: int) -> object:
        args = {"source": peer, "tag": tag, **kw}
        if callable(args.get("out")):
            args["out"] = args["out"]()
        return cai_mpi.recv_array(**args)

    return call


def _pointer() -> int:
    return int(_fake(np.zeros(1)).ptr)


def _read_only() -> np.ndarray[Any, Any]:
    out = np.zeros_like(SENT)
    out.flags.writeable = False
    return out


CAI, HOST, PEERS, OUT, META = (
    "`__cuda_array_interface__` dicts, sent with `send_array(obj, dest)`",
    "Other objects, sent with `send_array(obj, dest)`",
    "Peers, tags and other arguments",
    "Receive buffers, `recv_array(source, tag, out=out)`, for a message of 32768 float64",
    "`meta`, sent with `send_array(x, dest, meta=meta)`",
)
GROUPS = (CAI, HOST, PEERS, OUT, META)

CASES: tuple[BadInput, ...] = (
    # -- the CAI dict: every rule of the specification, each broken once
    *(BadInput(CAI, f"required key `{key}` missing", cai_mpi.CAIError, "send", _send_cai(**{key: _DROP}))
      for key in ("shape", "typestr", "data", "version")),
    BadInput(CAI, "the interface is a list, not a dict", cai_mpi.CAIError, "send",
             lambda peer, tag: cai_mpi.send_array(Exporter([(2, 3), "<f4"]), peer, tag)),
    BadInput(CAI, "`shape` an int: `6`", cai_mpi.CAIError, "send", _send_cai(shape=6)),
    BadInput(CAI, "`shape` with a float: `(2.0, 3)`", cai_mpi.CAIError, "send", _send_cai(shape=(2.0, 3))),
    BadInput(CAI, "`shape` negative: `(-2, 3)`", cai_mpi.CAIError, "send", _send_cai(shape=(-2, 3))),
    BadInput(CAI, "`shape` of more bytes than a 64-bit address space: `(2**62, 2)`", cai_mpi.CAIError, "send",
             _send_cai(shape=(2**62, 2), strides=(0, 0))),
    BadInput(CAI, "`shape` with a zero and a dimension over `2**63`", cai_mpi.CAIError, "send",
             _send_cai(shape=(0, 2**64 - 1), data=(0, False))),
    BadInput(CAI, "`shape` of 65 dimensions", cai_mpi.CAIError, "send", _send_cai(shape=(1,) * 65)),
    BadInput(CAI, "`typestr` not a str: `np.dtype('f4')`", cai_mpi.CAIError, "send",
             _send_cai(typestr=np.dtype("f4"))),
    BadInput(CAI, "`typestr` unknown: `'<x4'`", cai_mpi.CAIError, "send", _send_cai(typestr="<x4")),
    BadInput(CAI, "`typestr` of an impossible size: `'<f3'`", cai_mpi.CAIError, "send", _send_cai(typestr="<f3")),
    BadInput(CAI, "`typestr` a numpy name, not a type string: `'float32'`", cai_mpi.CAIError, "send",
             _send_cai(typestr="float32")),
    BadInput(CAI, "`typestr` a subarray: `'(2,)<f4'` (would read past the buffer)", cai_mpi.CAIError, "send",
             _send_cai(typestr="(2,)<f4")),
    BadInput(CAI, "`typestr` of Python objects: `'|O'`", cai_mpi.CAIError, "send", _send_cai(typestr="|O")),
    BadInput(CAI, "`typestr` of itemsize 0: `'|V0'`", cai_mpi.CAIError, "send", _send_cai(typestr="|V0")),
    BadInput(CAI, "`descr` with a Python-object field", cai_mpi.CAIError, "send",
             _send_cai(typestr="|V16", descr=[("a", "<f8"), ("o", "|O")])),
    BadInput(CAI, "`descr` larger than `typestr`: `'|V4'` with an 8-byte field", cai_mpi.CAIError, "send",
             _send_cai(typestr="|V4", descr=[("a", "<f8")])),
    BadInput(CAI, "`data` a bare pointer, not a 2-tuple", cai_mpi.CAIError, "send",
             lambda peer, tag: cai_mpi.send_array(_exporter(data=_pointer()), peer, tag)),
    BadInput(CAI, "`data` a 3-tuple", cai_mpi.CAIError, "send",
             lambda peer, tag: cai_mpi.send_array(_exporter(data=(_pointer(), False, 0)), peer, tag)),
    BadInput(CAI, "`data` read-only flag not a bool: `(ptr, 'no')`", cai_mpi.CAIError, "send",
             lambda peer, tag: cai_mpi.send_array(_exporter(data=(_pointer(), "no")), peer, tag)),
    BadInput(CAI, "`data` pointer negative: `(-4096, False)`", cai_mpi.CAIError, "send",
             _send_cai(data=(-4096, False))),
    BadInput(CAI, "`data` pointer past 64 bits: `(2**64, False)`", cai_mpi.CAIError, "send",
             _send_cai(data=(2**64, False))),
    BadInput(CAI, "`data` pointer so high that the array wraps past `2**64`: `(2**64 - 8, False)`", cai_mpi.CAIError,
             "send", _send_cai(data=(2**64 - 8, False))),
    BadInput(CAI, "`data` NULL pointer with elements: `(0, False)`", cai_mpi.CAIError, "send",
             _send_cai(data=(0, False))),
    BadInput(CAI, "`strides` of the wrong length: `(4,)` for 2 dimensions", cai_mpi.CAIError, "send",
             _send_cai(strides=(4,))),
    BadInput(CAI, "`strides` with a float: `(12.0, 4)`", cai_mpi.CAIError, "send", _send_cai(strides=(12.0, 4))),
    BadInput(CAI, "`strides` over `2**63`: `(2**63, 4)`", cai_mpi.CAIError, "send", _send_cai(strides=(2**63, 4))),
    BadInput(CAI, "`strides` that reach below address 0: `(-2**62, 4)`", cai_mpi.CAIError, "send",
             _send_cai(strides=(-(2**62), 4))),
    BadInput(CAI, "`mask` set (another array)", cai_mpi.CAIError, "send",
             _send_cai(mask=_fake(np.ones((2, 3), "?")))),
    BadInput(CAI, "`stream` 0 (forbidden by v3)", cai_mpi.CAIError, "send", _send_cai(stream=0)),
    BadInput(CAI, "`stream` negative: `-1`", cai_mpi.CAIError, "send", _send_cai(stream=-1)),
    BadInput(CAI, "`stream` not an int: `'1'`", cai_mpi.CAIError, "send", _send_cai(stream="1")),
    BadInput(CAI, "`stream` past 64 bits: `2**64`", cai_mpi.CAIError, "send", _send_cai(stream=2**64)),
    BadInput(CAI, "`stream` a handle on a rank without a GPU: `7`", cai_mpi.StreamError, "send",
             _send_cai(stream=7)),
    BadInput(CAI, "`version` negative: `-1`", cai_mpi.CAIError, "send", _send_cai(version=-1)),
    BadInput(CAI, "`version` a str: `'3'`", cai_mpi.CAIError, "send", _send_cai(version="3")),
    BadInput(CAI, "`version` a bool: `True`", cai_mpi.CAIError, "send", _send_cai(version=True)),
    BadInput(CAI, "`version` absurd: `2**70`", cai_mpi.CAIError, "send", _send_cai(version=2**70)),
    BadInput(CAI, "the `__cuda_array_interface__` property raises (`RuntimeError`, chained as the cause)",
             cai_mpi.CAIError, "send", _send(FailingExporter())),
    # -- objects that are no array at all
    BadInput(HOST, "an `object()`", TypeError, "send", _send(object())),
    BadInput(HOST, "a list: `[1, 2, 3]`", TypeError, "send", _send([1, 2, 3])),
    BadInput(HOST, "a numpy masked array (its data alone would lose the mask)", TypeError, "send",
             _send(np.ma.masked_array(_X, mask=_X > 2))),
    BadInput(HOST, "a numpy array of dtype `object` (references to Python objects)", TypeError, "send",
             _send(np.array([1, "x", None], dtype=object))),
    # -- where the message goes, and the other arguments
    BadInput(PEERS, "`dest` outside the communicator: `99`", ValueError, "send", _send(_X, dest=99)),
    BadInput(PEERS, "`dest` negative: `-7`", ValueError, "send", _send(_X, dest=-7)),
    BadInput(PEERS, "`dest` `ANY_SOURCE`", ValueError, "send", _send(_X, dest=MPI.ANY_SOURCE)),
    BadInput(PEERS, "`dest` a float: `1.0`", TypeError, "send", _send(_X, dest=1.0)),
    BadInput(PEERS, "`dest` a bool: `True`", TypeError, "send", _send(_X, dest=True)),
    BadInput(PEERS, "`tag` negative: `-5`", ValueError, "send", _send(_X, tag=-5)),
    BadInput(PEERS, "`tag` over `MPI.TAG_UB`: `2**31`", ValueError, "send", _send(_X, tag=2**31)),
    BadInput(PEERS, "`tag` `ANY_TAG` on a send", ValueError, "send", _send(_X, tag=MPI.ANY_TAG)),
    BadInput(PEERS, "`tag` a str: `'3'`", TypeError, "send", _send(_X, tag="3")),
    BadInput(PEERS, "`comm` not a communicator: `'world'`", TypeError, "send", _send(_X, comm="world")),
    BadInput(PEERS, "`comm` `MPI.COMM_NULL`", ValueError, "send", _send(_X, comm=MPI.COMM_NULL)),
    BadInput(PEERS, "`sync` not a bool: `'yes'` (a CAI object)", TypeError, "send",
             lambda peer, tag: cai_mpi.send_array(_fake(_X), peer, tag, sync="yes")),
    BadInput(PEERS, "send `timeout` negative: `-1`", ValueError, "send", _send(_X, timeout=-1)),
    BadInput(PEERS, "`source` outside the communicator: `99`", ValueError, "recv", _recv(source=99)),
    BadInput(PEERS, "`source` negative: `-7`", ValueError, "recv", _recv(source=-7)),
    BadInput(PEERS, "`source` a float: `0.0`", TypeError, "recv", _recv(source=0.0)),
    BadInput(PEERS, "`source` a bool: `False`", TypeError, "recv", _recv(source=False)),
    BadInput(PEERS, "receive `tag` negative: `-5`", ValueError, "recv", _recv(tag=-5)),
    BadInput(PEERS, "receive `tag` over `MPI.TAG_UB`: `2**31`", ValueError, "recv", _recv(tag=2**31)),
    BadInput(PEERS, "`device` negative: `-1`", ValueError, "recv", _recv(device=-1)),
    BadInput(PEERS, "`device` a GPU this rank does not have: `3`", ValueError, "recv", _recv(device=3)),
    BadInput(PEERS, "`device` unknown: `'gpu'`", ValueError, "recv", _recv(device="gpu")),
    BadInput(PEERS, "receive `timeout` not a number: `'1'`", TypeError, "recv", _recv(timeout="1")),
    # -- receive buffers: refused before matching (not a buffer), or matched and drained (does not fit)
    BadInput(OUT, "`out` a list", TypeError, "recv", _recv(out=lambda: [0.0] * SENT.size)),
    BadInput(OUT, "`out` a numpy masked array", TypeError, "recv", _recv(out=lambda: np.ma.zeros(SENT.size))),
    BadInput(OUT, "`out` a CAI object with `stream` 0", cai_mpi.CAIError, "recv",
             _recv(out=lambda: _fake(np.zeros_like(SENT), stream=0))),
    BadInput(OUT, "`out` whose `__cuda_array_interface__` property raises", cai_mpi.CAIError, "recv",
             _recv(out=FailingExporter)),
    BadInput(OUT, "`out` read-only (numpy)", cai_mpi.RecvMismatchError, "recv", _recv(out=_read_only),
             consumed=True),
    BadInput(OUT, "`out` read-only (a CAI object exporting `data=(ptr, True)`)", cai_mpi.RecvMismatchError, "recv",
             _recv(out=lambda: _fake(np.zeros_like(SENT), readonly=True)), consumed=True),
    BadInput(OUT, "`out` too small: 32767 elements", cai_mpi.RecvMismatchError, "recv",
             _recv(out=lambda: np.zeros(SENT.size - 1)), consumed=True),
    BadInput(OUT, "`out` too large: 32769 elements", cai_mpi.RecvMismatchError, "recv",
             _recv(out=lambda: np.zeros(SENT.size + 1)), consumed=True),
    BadInput(OUT, "`out` of the same size, another shape: `(128, 256)`", cai_mpi.RecvMismatchError, "recv",
             _recv(out=lambda: np.zeros((128, 256))), consumed=True),
    BadInput(OUT, "`out` of another dtype: float32", cai_mpi.RecvMismatchError, "recv",
             _recv(out=lambda: np.zeros(SENT.size, np.float32)), consumed=True),
    BadInput(OUT, "`out` of another byte order: `>f8`", cai_mpi.RecvMismatchError, "recv",
             _recv(out=lambda: np.zeros(SENT.size, ">f8")), consumed=True),
    BadInput(OUT, "`out` with overlapping strides (stride 0)", cai_mpi.RecvMismatchError, "recv",
             _recv(out=lambda: as_strided(np.zeros(1), shape=SENT.shape, strides=(0,))), consumed=True),
    # -- meta
    BadInput(META, "not a dict: `[1]`", TypeError, "send", _send(_X, meta=[1])),
    BadInput(META, "a value JSON cannot hold: `{'a': {1}}`", TypeError, "send", _send(_X, meta={"a": {1}})),
    BadInput(META, "NaN: `{'a': float('nan')}`", TypeError, "send", _send(_X, meta={"a": float("nan")})),
    BadInput(META, "a non-str key: `{1: 2}`", TypeError, "send", _send(_X, meta={1: 2})),
    BadInput(META, "a numpy array (only scalars and 0-d arrays travel): `{'a': np.arange(3)}`", TypeError, "send",
             _send(_X, meta={"a": np.arange(3)})),
    BadInput(META, "over 16 KiB as JSON", ValueError, "send", _send(_X, meta={"a": "x" * 20000})),
    BadInput(META, "nested 5,000 levels deep (10 KB as JSON)", TypeError, "send", _send(_X, meta=nested(5000))),
)
