"""The transfer modes compared side by side: raw mpi4py, pickle, cai_mpi with and without ``out=``, ..."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

from .buffers import BufferKind

__all__ = ["DEFAULT_MODES", "MODES", "Context", "Mode", "ModeSpec", "SharedBuffers", "TAG"]

TAG = 7  # every mode uses this tag (raw/pickle on the bench's communicator, cai_mpi on its own)


@dataclasses.dataclass
class Context:
    """What every mode needs: the bench's private communicator, the buffer kind, CUDA-awareness.

    ``window``: how many messages one side keeps in flight (bw/bibw windows; 1 otherwise).
    ``test``: the benchmark (latency, bw, ..., bcast: modes that belong to one test say so).
    ``buffers``: the memory every mode of one message size sends from and receives into (None: each
    mode allocates its own).
    """

    comm: MPI.Comm
    kind: BufferKind
    aware: bool
    window: int = 1
    buffers: SharedBuffers | None = None
    test: str = ""  # the benchmark being run (some modes belong to one test only)


class SharedBuffers:
    """One source and two receive buffers of one size, shared by the modes compared side by side.

    The same code copying between two freshly allocated buffers ran at 13 or at 25 GB/s on the
    development machine, depending on which physical pages the pair drew, and the draw held for
    the whole run. With buffers of their own, two modes compared two draws; sharing them makes
    ``raw`` and every ``out=`` mode move exactly the same memory, so their ratio is the software's.
    (Receives without ``out=`` land in the memory cai_mpi or pickle allocates: that is theirs.)
    """

    def __init__(self, kind: BufferKind, nbytes: int) -> None:
        self.src: Any = kind.alloc(nbytes)
        self.dst: list[Any] = [kind.alloc(nbytes), kind.alloc(nbytes)]


class Mode:
    """One way of moving an array. Handles returned by ``isend``/``irecv`` complete in ``waitall``.

    ``recv`` returns an object that ``send`` can send on (the echo rank of the ping-pong and the
    middle ranks of the pipeline forward what they received). ``slot`` (0 or 1) selects one of
    two receive buffers for modes that own them, so a forward can be in flight while the next
    item arrives.
    """

    def __init__(self, ctx: Context, nbytes: int) -> None:
        self.ctx = ctx
        self.comm = ctx.comm
        self.kind = ctx.kind
        self.nbytes = nbytes
        self.buffers = ctx.buffers or SharedBuffers(ctx.kind, nbytes)
        self.src: Any = self.buffers.src

    def enter(self) -> None:
        """Called before each timed or warm-up block of this mode."""

    def leave(self) -> None:
        """Called after each block (undo ``enter``)."""

    def close(self) -> None:
        """Called once every sample of this size is done (free what the mode opened)."""

    def send(self, obj: Any, dest: int) -> None:
        raise NotImplementedError

    def recv(self, source: int, slot: int = 0) -> Any:
        raise NotImplementedError

    def isend(self, obj: Any, dest: int) -> Any:
        raise NotImplementedError

    def irecv(self, source: int, slot: int = 0) -> Any:
        """A receive handle; by default a deferred blocking ``recv`` run by ``waitall`` (see below)."""
        return _DeferredRecv(source, slot)

    def waitall(self, handles: list[Any]) -> None:
        """Complete ``handles``: deferred receives one by one, each result dropped before the next."""
        sends = []
        for h in handles:
            if isinstance(h, _DeferredRecv):
                self.recv(h.source, h.slot)
            else:
                sends.append(h)
        if sends:
            self.wait_sends(sends)

    def wait_sends(self, handles: list[Any]) -> None:
        raise NotImplementedError


@dataclasses.dataclass
class _DeferredRecv:
    """A receive that ``waitall`` performs with a blocking ``recv`` (nothing is posted in advance)."""

    source: int
    slot: int


class RawMode(Mode):
    """mpi4py ``Send``/``Recv`` on preallocated buffers of known size: the floor.

    Device buffers go to MPI directly when it is CUDA-aware; otherwise (or with ``staged``)
    they are copied through a host buffer by hand, which is what cai_mpi's staged route competes with.
    """

    def __init__(self, ctx: Context, nbytes: int, *, staged: bool = False) -> None:
        super().__init__(ctx, nbytes)
        self.direct = not staged and (not self.kind.device or ctx.aware)
        self.dst = self.buffers.dst
        if self.direct:
            self._mpi_src = self.kind.mpi_object(self.src)
            self._mpi_dst = [self.kind.mpi_object(d) for d in self.dst]
        else:
            self.stage_out = self.kind.host_empty(nbytes)
            self.stage_in = [self.kind.host_empty(nbytes), self.kind.host_empty(nbytes)]

    def _out(self, obj: Any) -> Any:
        if not self.direct:
            self.kind.to_host(obj, self.stage_out)
            return self.stage_out
        if obj is self.src:
            return self._mpi_src
        return self._mpi_dst[0] if obj is self.dst[0] else self._mpi_dst[1]

    def send(self, obj: Any, dest: int) -> None:
        self.comm.Send(self._out(obj), dest, TAG)

    def recv(self, source: int, slot: int = 0) -> Any:
        if self.direct:
            self.comm.Recv(self._mpi_dst[slot], source, TAG)
        else:
            self.comm.Recv(self.stage_in[slot], source, TAG)
            self.kind.from_host(self.stage_in[slot], self.dst[slot])
        return self.dst[slot]

    def isend(self, obj: Any, dest: int) -> Any:
        return self.comm.Isend(self._out(obj), dest, TAG)

    def irecv(self, source: int, slot: int = 0) -> Any:
        if self.direct:
            return self.comm.Irecv(self._mpi_dst[slot], source, TAG)
        return _Staged(self.comm.Irecv(self.stage_in[slot], source, TAG), self, slot)

    def waitall(self, handles: list[Any]) -> None:
        if self.direct or not handles:
            MPI.Request.Waitall(handles)
            return
        MPI.Request.Waitall([h.req if isinstance(h, _Staged) else h for h in handles])
        for h in handles:
            if isinstance(h, _Staged):
                self.kind.from_host(self.stage_in[h.slot], self.dst[h.slot])


class RawHeaderMode(RawMode):
    """mpi4py, a 64-byte header message before each payload (the payload tag in it, as cai_mpi does).

    The floor of any self-describing protocol that sends header and payload as two messages:
    what cai_mpi with ``out=`` pays over it is its own Python, what it pays under ``raw`` is the
    second message. Host buffers (or a CUDA-aware MPI) only.
    """

    _HEADER = 64

    def __init__(self, ctx: Context, nbytes: int) -> None:
        super().__init__(ctx, nbytes)
        self.payload_comm = ctx.comm.Dup()
        self._next_tag = 0
        self._out_header = [bytearray(self._HEADER) for _ in range(max(2, ctx.window))]  # pipeline: 2 in flight
        self._in_header = bytearray(self._HEADER)

    def _header(self) -> tuple[bytearray, int]:
        """The next header buffer (one per message in flight) carrying the next payload tag."""
        tag = self._next_tag = (self._next_tag + 1) % 32768
        header = self._out_header[tag % len(self._out_header)]
        header[:4] = tag.to_bytes(4, "little")
        return header, tag

    def send(self, obj: Any, dest: int) -> None:
        header, ptag = self._header()
        hreq = self.comm.Isend(header, dest, TAG)
        self.payload_comm.Send(self._out(obj), dest, ptag)
        hreq.Wait()

    def recv(self, source: int, slot: int = 0) -> Any:
        self.comm.Recv(self._in_header, source, TAG)
        ptag = int.from_bytes(self._in_header[:4], "little")
        self.payload_comm.Recv(self._mpi_dst[slot], source, ptag)
        return self.dst[slot]

    def isend(self, obj: Any, dest: int) -> Any:
        header, ptag = self._header()
        return [self.comm.Isend(header, dest, TAG), self.payload_comm.Isend(self._out(obj), dest, ptag)]

    # The payload tag is in the header: nothing can be posted ahead, so receives in a window are
    # deferred blocking recv()s, as for the other self-describing modes (not RawMode's Irecv).
    irecv = Mode.irecv
    waitall = Mode.waitall

    def wait_sends(self, handles: list[Any]) -> None:
        MPI.Request.Waitall([req for pair in handles for req in pair])

    def close(self) -> None:
        self.payload_comm.Free()


@dataclasses.dataclass
class _Staged:
    req: MPI.Request
    mode: RawMode
    slot: int


class PickleMode(Mode):
    """mpi4py's lowercase ``send``/``recv``: what users write when the receiver does not know the shape.

    Device arrays travel as pickled host copies (``cupy.asnumpy`` and back). Receives are
    blocking ``recv`` calls even in windows: mpi4py's ``irecv()`` without a buffer only fits
    small messages, so code that does not know sizes receives with ``recv`` (each object
    dropped before the next).
    """

    def send(self, obj: Any, dest: int) -> None:
        self.comm.send(self.kind.host_copy(obj), dest, TAG)

    def recv(self, source: int, slot: int = 0) -> Any:
        return self.kind.from_host_new(self.comm.recv(source=source, tag=TAG))

    def isend(self, obj: Any, dest: int) -> Any:
        return self.comm.isend(self.kind.host_copy(obj), dest, TAG)

    def wait_sends(self, handles: list[Any]) -> None:
        MPI.Request.waitall(handles)


class CaiMode(Mode):
    """``cai_mpi.send_array`` / ``recv_array`` (and ``isend_array`` for windows of sends).

    Windows of receives are blocking ``recv_array`` calls, each Array dropped before the next
    (the steady state: pooled host memory is reused), unless ``posted``: then the receiver
    posts a window of ``irecv_array`` like osu_bw posts ``MPI_Irecv``. cai_mpi posts a payload
    receive only once its header is in, so posting ahead mostly adds progress-engine work.

    ``out``: receive into preallocated buffers. ``sync``: passed to ``send_array``.
    ``inline_bytes``: CAI_MPI_INLINE_BYTES while this mode runs (None: the environment's).
    """

    def __init__(
        self, ctx: Context, nbytes: int, *, out: bool = False, sync: bool | None = None,
        inline_bytes: int | None = None, posted: bool = False,
    ) -> None:
        super().__init__(ctx, nbytes)
        import cai_mpi

        self.cai = cai_mpi
        self.sync = sync
        self.inline_bytes = inline_bytes
        self.posted = posted
        self.dst: list[Any] | None = self.buffers.dst if out else None

    def enter(self) -> None:
        if self.inline_bytes is not None:
            from ...config import reload_config

            reload_config({**os.environ, "CAI_MPI_INLINE_BYTES": str(self.inline_bytes)})

    def leave(self) -> None:
        if self.inline_bytes is not None:
            from ...config import reload_config

            reload_config()

    def send(self, obj: Any, dest: int) -> None:
        self.cai.send_array(obj, dest, TAG, sync=self.sync)

    def recv(self, source: int, slot: int = 0) -> Any:
        return self.cai.recv_array(source, TAG, out=None if self.dst is None else self.dst[slot])

    def isend(self, obj: Any, dest: int) -> Any:
        return self.cai.isend_array(obj, dest, TAG, sync=self.sync)

    def irecv(self, source: int, slot: int = 0) -> Any:
        if not self.posted:
            return super().irecv(source, slot)
        return self.cai.irecv_array(source, TAG, out=None if self.dst is None else self.dst[slot])

    def waitall(self, handles: list[Any]) -> None:
        if not self.posted:
            super().waitall(handles)
            return
        for h in handles:
            h.wait()

    def wait_sends(self, handles: list[Any]) -> None:
        for h in handles:
            h.wait()


class ChannelMode(Mode):
    """cai_mpi's persistent channels: ``send_channel(x, peer)`` / ``recv_channel(peer, out=buf)``, opened once.

    A channel pairs one sender with one receiver, message for message, and holds one message in
    flight. So each direction between two ranks uses a ring of channels in turn, as many as the
    messages a side keeps in flight (``ctx.window``, at least two: double buffering): message k
    travels on channel k mod ring, like a window of MPI persistent requests. Channel c receives into
    ``dst[c % 2]``: two buffers, as ``raw`` (and osu_bw) receive a window into the same memory, so
    both modes touch the same amount of it. The echo and pipeline ranks forward the buffer they
    received through their own channel. The first message of each channel carries the description,
    in the warm-up.
    """

    def __init__(self, ctx: Context, nbytes: int) -> None:
        super().__init__(ctx, nbytes)
        import cai_mpi

        self.cai = cai_mpi
        # (a halo exchange completes before the next one starts: one channel per neighbour, receiving into that
        # neighbour's buffer, as raw's one receive per neighbour does)
        self.ring = 1 if ctx.test == "halo" else max(2, ctx.window)
        self.dst = self.buffers.dst
        ranks = ctx.comm.Get_size()
        # Per peer: which channel of the ring the next message uses, and the channels themselves
        # (send channels by the id of the object they send). Lean on purpose: this is timed too.
        self._tx_turn = [0] * ranks
        self._rx_turn = [0] * ranks
        self._tx: list[list[dict[int, Any]]] = [[{} for _ in range(self.ring)] for _ in range(ranks)]
        self._rx: list[list[Any]] = [[None] * self.ring for _ in range(ranks)]

    def _sender(self, obj: Any, dest: int) -> Any:
        turn = self._tx_turn[dest]
        self._tx_turn[dest] = (turn + 1) % self.ring
        tx = self._tx[dest][turn].get(id(obj))
        if tx is None:
            tx = self._tx[dest][turn][id(obj)] = self.cai.send_channel(obj, dest, TAG)
        return tx

    def _receiver(self, source: int, slot: int = 0) -> tuple[Any, int]:
        turn = self._rx_turn[source]
        self._rx_turn[source] = (turn + 1) % self.ring
        buf = slot if self.ring == 1 else turn & 1
        rx = self._rx[source][turn]
        if rx is None:
            rx = self._rx[source][turn] = self.cai.recv_channel(source, TAG, out=self.dst[buf])
        return rx, buf

    def send(self, obj: Any, dest: int) -> None:
        self._sender(obj, dest).send()

    def recv(self, source: int, slot: int = 0) -> Any:
        rx, buf = self._receiver(source)
        rx.recv()
        return self.dst[buf]

    def isend(self, obj: Any, dest: int) -> Any:
        return self._sender(obj, dest).isend()

    def irecv(self, source: int, slot: int = 0) -> Any:
        return self._receiver(source, slot)[0].irecv()

    def waitall(self, handles: list[Any]) -> None:
        for h in handles:
            h.wait()

    def close(self) -> None:
        for per_peer in self._tx:
            for chans in per_peer:
                for tx in chans.values():
                    tx.close()
        for ring in self._rx:
            for rx in ring:
                if rx is not None:
                    rx.close()


def _channel_unavailable(ctx: Context) -> str | None:
    if ctx.kind.device and not ctx.aware:
        return "channels hand device memory to MPI in place: they need a CUDA-aware MPI"
    return None


def _raw_header_unavailable(ctx: Context) -> str | None:
    if ctx.kind.device and not ctx.aware:
        return "sends device memory to MPI in place: needs a CUDA-aware MPI"
    return None


def _raw_staged_unavailable(ctx: Context) -> str | None:
    if ctx.kind.device:
        return None
    return "only meaningful for device buffers (--buffer simulated/cupy/torch/numba)"


@dataclasses.dataclass(frozen=True)
class ModeSpec:
    name: str
    description: str
    make: Callable[[Context, int], Mode]
    unavailable: Callable[[Context], str | None] = lambda ctx: None


MODES: dict[str, ModeSpec] = {
    s.name: s
    for s in (
        ModeSpec("raw", "mpi4py Send/Recv into preallocated buffers (the floor)", RawMode),
        ModeSpec("raw-staged", "mpi4py Send/Recv through host copies made by hand (device buffers)",
                 lambda c, n: RawMode(c, n, staged=True), _raw_staged_unavailable),
        ModeSpec("raw-header", "mpi4py, a header message (with the payload tag) before each payload: the "
                 "floor of a header + payload protocol", RawHeaderMode, _raw_header_unavailable),
        ModeSpec("pickle", "mpi4py pickle send/recv (shape unknown to the receiver)", PickleMode),
        ModeSpec("cai", "cai_mpi send_array / recv_array without out=", CaiMode),
        ModeSpec("cai-out", "cai_mpi recv_array(out=preallocated)", lambda c, n: CaiMode(c, n, out=True)),
        ModeSpec("cai-irecv", "cai, the bw/bibw receiver posting a window of irecv_array (like osu_bw)",
                 lambda c, n: CaiMode(c, n, posted=True)),
        ModeSpec("cai-out-irecv", "cai-out, the bw/bibw receiver posting a window of irecv_array(out=)",
                 lambda c, n: CaiMode(c, n, out=True, posted=True)),
        ModeSpec("cai-noinline", "cai, with CAI_MPI_INLINE_BYTES=0 (always header + payload)",
                 lambda c, n: CaiMode(c, n, inline_bytes=0)),
        ModeSpec("cai-nosync", "cai, with send_array(sync=False) (no producer-stream synchronization)",
                 lambda c, n: CaiMode(c, n, sync=False)),
        ModeSpec("channel", "cai_mpi send_channel / recv_channel(out=) (persistent: described once)",
                 ChannelMode, _channel_unavailable),
    )
}

DEFAULT_MODES = ("raw", "pickle", "cai", "cai-out", "channel")
