"""The soak's rounds. Every rank runs the same schedule, drawn from the seed: in each round of a thread (on its
own communicator) every rank exchanges one message with every other rank, in one of four ways:

- ``exchange``: pairwise shifts; per shift sendrecv_array, isend+recv, irecv+send or isend+irecv, received
  from the exact source or ANY_SOURCE (exact tag), with the exact tag or ANY_TAG (exact source), into new
  memory (host or device) or an ``out=`` of any layout and exporter;
- ``wildcard``: everyone sends to everyone at once, received with ANY_SOURCE and ANY_TAG, told apart by ``meta``;
- ``channel``: one persistent channel per pair, new contents every round;
- ``collective``: one of the seven shape-free collectives, contributions of different shapes and dtypes.

Each received array is checked against the contents its id derives (``messages``)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import numpy as np
from mpi4py import MPI

from ....testing import FakeCudaArray
from ...api.channel import RecvChannel, SendChannel, recv_channel, send_channel
from ...api.collectives import bcast_array
from ...api.gathers import allgather_array, gather_array
from ...api.p2p import ANY_SOURCE, ANY_TAG, irecv_array, isend_array, recv_array, send_array, sendrecv_array
from ...api.reductions import allreduce_array, reduce_array
from ...api.scatters import alltoall_array, scatter_array
from ...errors import TimeoutError
from .messages import HOST, Ident, Spec, content, digest, make, problem, receive_buffer, spec_for

__all__ = ["KINDS", "Worker", "kind_of", "round_messages"]

KINDS = ("exchange", "wildcard", "channel", "collective")
_WEIGHTS = (0.45, 0.2, 0.15, 0.2)
COLLECTIVES = ("bcast", "gather", "allgather", "scatter", "alltoall", "reduce", "allreduce")
_CHANNEL_TAG = 1  # exchange tags start above it
_WILDCARD_TAG = 2


def kind_of(seed: int, thread: int, rnd: int) -> tuple[str, str]:
    """(kind, collective or '') of round ``rnd`` of ``thread``: the same on every rank."""
    rng = np.random.default_rng([seed, 7, thread, rnd])
    kind = KINDS[int(rng.choice(len(KINDS), p=_WEIGHTS))]
    return kind, COLLECTIVES[int(rng.integers(len(COLLECTIVES)))] if kind == "collective" else ""


def round_messages(kind: str, collective: str, n: int) -> int:
    """Arrays received from other ranks in such a round, over all ``n`` ranks."""
    if kind == "collective" and collective in ("bcast", "gather", "scatter", "reduce"):
        return n - 1
    return n * (n - 1)


class Worker:
    """One thread's rounds on ``comm``; counts what arrived by kind and records every failure."""

    def __init__(self, thread: int, comm: MPI.Intracomm, seed: int, max_bytes: int, timeout: float,
                 runtime: str) -> None:
        self.thread, self.comm, self.seed, self.timeout, self.runtime = thread, comm, seed, timeout, runtime
        self.max_bytes = max_bytes
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.messages: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self.failures: list[str] = []
        self._send_channels: dict[int, tuple[SendChannel, Spec, np.ndarray[Any, Any]]] = {}
        self._recv_channels: dict[int, tuple[RecvChannel, Spec]] = {}

    def run(self, rnd: int) -> None:
        kind, collective = kind_of(self.seed, self.thread, rnd)
        if kind == "collective":
            self.collective(rnd, collective)
        else:
            getattr(self, kind)(rnd)

    def close(self) -> None:
        """Close every channel, within one ``timeout`` for them all: a failed round may have left a message in flight
        that its peer will never take (closing then times out, and says so among the failures)."""
        due = time.monotonic() + self.timeout
        channels: list[tuple[str, SendChannel | RecvChannel]] = [
            (f"channel to rank {dest}", ch) for dest, (ch, _spec, _buf) in self._send_channels.items()]
        channels += [(f"channel from rank {source}", ch) for source, (ch, _spec) in self._recv_channels.items()]
        for what, channel in channels:
            try:
                channel.close(timeout=max(0.0, due - time.monotonic()))
            except Exception as exc:
                self.failures.append(f"closing the {what}: {type(exc).__name__}: {exc}")
        self._send_channels.clear()
        self._recv_channels.clear()

    # -- checking ---------------------------------------------------------------------------------------------

    def _spec(self, ident: Ident, **kw: Any) -> Spec:
        return spec_for(ident, self.seed, self.max_bytes, **kw)

    def _outgoing(self, spec: Spec) -> Any:
        return make(spec, content(spec, self.seed), self.runtime)[0]

    def check(self, kind: str, got: Any, spec: Spec, meta: Any = None) -> None:
        self.messages[kind] += 1
        self.bytes[kind] += spec.nbytes
        wrong = problem(got, spec, digest(content(spec, self.seed)), meta)
        if wrong is not None:
            self.failures.append(f"{kind}: {wrong}")

    @staticmethod
    def _meta(spec: Spec) -> dict[str, Any]:
        return {"id": list(spec.ident)}

    # -- the four kinds ---------------------------------------------------------------------------------------

    def exchange(self, rnd: int) -> None:
        t, me, n = self.thread, self.rank, self.size
        for k in range(1, n):
            dest, source = (me + k) % n, (me - k) % n
            tag = _WILDCARD_TAG + 1 + (rnd * n + k) % (1 << 20)
            mine, theirs = self._spec((rnd, t, me, dest, k)), self._spec((rnd, t, source, me, k))
            rng = np.random.default_rng([self.seed, 8, t, rnd, k, me])  # this receiver's choices
            how = ("sendrecv", "isend+recv", "irecv+send", "isend+irecv")[(rnd + k) % 4]  # the same on every rank
            match = int(rng.integers(3))
            src_arg, tag_arg = (source, tag) if match == 0 else (ANY_SOURCE, tag) if match == 1 else (source, ANY_TAG)
            kw: dict[str, Any] = {}
            readback = None
            choice = int(rng.integers(4))
            if choice == 0:
                kw["out"], readback = receive_buffer(theirs, self.runtime)
            elif choice == 1:
                kw["device"] = "host"
            obj = self._outgoing(mine)
            meta = self._meta(mine)
            if how == "sendrecv":
                got = sendrecv_array(obj, dest, tag, src_arg, tag_arg, self.comm, meta=meta, timeout=self.timeout, **kw)
            elif how == "isend+recv":
                sent = isend_array(obj, dest, tag, self.comm, meta=meta)
                got = recv_array(src_arg, tag_arg, self.comm, timeout=self.timeout, **kw)
                sent.wait(self.timeout)
            elif how == "irecv+send":
                pending = irecv_array(src_arg, tag_arg, self.comm, **kw)
                send_array(obj, dest, tag, self.comm, meta=meta, timeout=self.timeout)
                got = pending.wait(self.timeout)
            else:
                sent = isend_array(obj, dest, tag, self.comm, meta=meta)
                got = irecv_array(src_arg, tag_arg, self.comm, **kw).wait(self.timeout)
                sent.wait(self.timeout)
            if got.source != source:
                self.failures.append(f"exchange {theirs.ident}: came from rank {got.source}")
            self.check("exchange", got, theirs, self._meta(theirs))
            if readback is not None:  # the out= buffer itself holds the message
                self._check_buffer("exchange", kw["out"], readback, theirs)

    def _check_buffer(self, kind: str, out: Any, readback: np.ndarray[Any, Any] | None, spec: Spec) -> None:
        if readback is None:  # a CUDA device out=: read it through the CAI
            import cupy

            readback = cupy.asnumpy(cupy.asarray(out))
        if digest(np.ascontiguousarray(readback)) != digest(content(spec, self.seed)):
            self.failures.append(f"{kind}: {spec.ident}: out= does not hold the message")

    def wildcard(self, rnd: int) -> None:
        t, me, n = self.thread, self.rank, self.size
        sent = []
        for dest in range(n):
            if dest != me:
                spec = self._spec((rnd, t, me, dest, 0))
                sent.append(isend_array(self._outgoing(spec), dest, _WILDCARD_TAG, self.comm, meta=self._meta(spec)))
        # Half the receives are posted at once (irecv), half taken one by one (recv).
        posted = [irecv_array(ANY_SOURCE, ANY_TAG, self.comm) for _ in range((n - 1) // 2)]
        arrived = [recv_array(ANY_SOURCE, ANY_TAG, self.comm, timeout=self.timeout) for _ in range(n - 1 - len(posted))]
        arrived += [req.wait(self.timeout) for req in posted]
        senders = set()
        for got in arrived:
            ident = tuple((got.meta or {}).get("id", ()))
            if len(ident) != 5 or ident[:2] != (rnd, t) or ident[2] != got.source or ident[3] != me:
                self.failures.append(f"wildcard round {rnd}: unexpected message {ident} from rank {got.source}")
                continue
            senders.add(got.source)
            spec = self._spec(ident)
            self.check("wildcard", got, spec, self._meta(spec))
        if len(senders) != n - 1:
            self.failures.append(f"wildcard round {rnd}: messages from {sorted(senders)}, expected every other rank")
        for req in sent:
            req.wait(self.timeout)
        self._barrier()  # no wildcard receive of the next round can take this round's message, nor the reverse

    def _barrier(self) -> None:
        req = self.comm.Ibarrier()
        due = time.monotonic() + self.timeout
        while not req.Test():
            if time.monotonic() > due:
                raise TimeoutError(f"soak: a barrier on thread {self.thread} waited over {self.timeout} s",
                                   self.timeout, False)
            time.sleep(1e-4)

    def channel(self, rnd: int) -> None:
        t, me, n = self.thread, self.rank, self.size
        sends = []
        for dest in range(n):
            if dest == me:
                continue
            if dest not in self._send_channels:  # the channel's shape and dtype: fixed, drawn once per pair
                spec = self._spec((-1, t, me, dest, 0), layouts=("C",), exports=(HOST,))
                buf = np.zeros(spec.shape, spec.dtype)
                self._send_channels[dest] = (send_channel(buf, dest, _CHANNEL_TAG, self.comm), spec, buf)
            channel, spec, buf = self._send_channels[dest]
            buf[...] = content(_this_round(spec, rnd), self.seed)
            sends.append(channel.isend())
        for source in range(n):
            if source == me:
                continue
            if source not in self._recv_channels:
                spec = self._spec((-1, t, source, me, 0), layouts=("C",), exports=(HOST,))
                self._recv_channels[source] = (recv_channel(source, _CHANNEL_TAG, self.comm, device="host"), spec)
            rchannel, spec = self._recv_channels[source]
            self.check("channel", rchannel.recv(self.timeout), _this_round(spec, rnd))
        for req in sends:
            req.wait(self.timeout)

    def collective(self, rnd: int, which: str) -> None:
        t, me, n = self.thread, self.rank, self.size
        root = rnd % n
        kind = "collective"
        if which in ("reduce", "allreduce"):
            self._reduction(rnd, which, root)
            return
        if which == "bcast":
            spec = self._spec((rnd, t, root, -1, 0))
            got = bcast_array(self._outgoing(spec) if me == root else None, root, self.comm, timeout=self.timeout)
            if me != root:
                self.check(kind, got, spec)
            return
        if which == "scatter":
            specs = [self._spec((rnd, t, root, r, 0)) for r in range(n)]
            got = scatter_array([self._outgoing(s) for s in specs] if me == root else None, root, self.comm,
                                timeout=self.timeout)
            if me != root:
                self.check(kind, got, specs[me])
            return
        if which == "alltoall":
            pieces = alltoall_array([self._outgoing(self._spec((rnd, t, me, r, 0))) for r in range(n)], self.comm,
                                    timeout=self.timeout)
            for r, got in enumerate(pieces):
                if r != me:
                    self.check(kind, got, self._spec((rnd, t, r, me, 0)))
            return
        mine = self._outgoing(self._spec((rnd, t, me, -1, 0)))
        gathered = (gather_array(mine, root, self.comm, timeout=self.timeout) if which == "gather"
                    else allgather_array(mine, self.comm, timeout=self.timeout))
        for r, got in enumerate(gathered or ()):
            if r != me:
                self.check(kind, got, self._spec((rnd, t, r, -1, 0)))

    def _reduction(self, rnd: int, which: str, root: int) -> None:
        """Small integers summed: the exact result is known (every rank's contribution derives from its id)."""
        t, me, n = self.thread, self.rank, self.size
        shape = self._spec((rnd, t, 0, -1, 1)).shape  # the same on every rank

        def part(r: int) -> np.ndarray[Any, Any]:
            return np.random.default_rng([self.seed, 9, t, rnd, r]).integers(-1000, 1000, shape, np.int64)

        mine: Any = part(me)
        if rnd % 2 and self.runtime != "cuda":  # also as a CAI object
            mine = FakeCudaArray(mine, device=self.runtime == "simulated")
        got = (allreduce_array(mine, "sum", self.comm, timeout=self.timeout) if which == "allreduce"
               else reduce_array(mine, "sum", root, self.comm, timeout=self.timeout))
        if got is None:
            return
        expected = sum((part(r) for r in range(n)), np.zeros(shape, np.int64))
        self.messages["collective"] += n - 1
        self.bytes["collective"] += (n - 1) * expected.nbytes
        if got.shape != expected.shape or digest(got.numpy()) != digest(expected):
            self.failures.append(f"{which} round {rnd}: the sum differs")


def _this_round(spec: Spec, rnd: int) -> Spec:
    """A channel's fixed description with this round's contents."""
    _r, t, source, dest, slot = spec.ident
    return Spec((rnd, t, source, dest, slot), spec.dtype, spec.shape, spec.layout, spec.export)
