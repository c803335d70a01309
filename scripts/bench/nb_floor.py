"""What a nonblocking pair costs in Python at the least, with cai_mpi's wire: the floor under issue 37's target.

    python scripts/bench/nb_floor.py [--pairs N] [--reps R] [--json FILE]

One process sends 8-byte float64 arrays to itself (as ``self_loop.py``; Open MPI's wheel), CPU time per pair
(``time.thread_time``), the least over R repetitions, three ways:

- ``raw-nb``: mpi4py's ``Irecv`` + ``Isend`` + ``Waitall`` into known buffers;
- ``wire-nb``: the same exchange as cai_mpi's wire carries it, in the fewest Python calls that can: the header with
  the inline payload as one message (``inline_message``), received into a header buffer, decoded through the
  header memo, copied into ``out=`` and wrapped in an Array. No argument checks, no request object, no deadline, no
  progress rule: what no cai_mpi request can go below;
- ``body-nb``: what cai_mpi's calls run besides their requests: the receive's and the send's own argument checks
  and the send's plan (``p2p._receive_args``, ``p2p._outbound``), the send's posting (``post_send``), the
  header receive into an inbox and its landing (``plan_recv``: decode, the fit check, the Array), with MPI's waits
  and no request object: the price of the request machinery is ``cai-nb`` less this;
- ``cai-nb``: ``irecv_array(out=)`` + ``isend_array`` + ``waitall``;
- ``channel-nb``: a ``recv_channel(out=)``'s ``irecv()`` + a ``send_channel``'s ``isend()`` + ``waitall``, the
  channels opened once (a halo exchange's steady state).

Reads library internals on purpose (the header codec, ``Array.over_host``, the transport's bodies): it measures
the wire and the bodies, not the API.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from cai_mpi import irecv_array, isend_array, recv_channel, send_channel, waitall
from cai_mpi._src.api.p2p import _outbound, _receive_args
from cai_mpi._src.arrays.array import Array
from cai_mpi._src.config import config
from cai_mpi._src.core.header import HeaderMemo, inline_message
from cai_mpi._src.transport import NONBLOCKING, post_send
from cai_mpi._src.transport.receive import give_back_inbox, plan_recv, take_inbox

BYTE = MPI.BYTE
NO_LIMIT = 1 << 62


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD.Dup()  # (cai_mpi's own duplicate of COMM_WORLD is not disturbed by wire-nb's messages)
    me = comm.Get_rank()
    x, out, landing = np.arange(1, dtype=np.float64), np.empty(1), np.empty(1)
    memo = HeaderMemo()
    tag = 0
    status = MPI.Status()

    def raw_nb(n: int) -> None:
        for _ in range(n):
            MPI.Request.Waitall([comm.Irecv(landing, me, 0), comm.Isend(x, me, 0)])

    def wire_nb(n: int) -> None:
        for _ in range(n):
            inbox = bytearray(4096)
            recv = comm.Irecv([inbox, BYTE], me, 0)
            send = comm.Isend([inline_message(x), BYTE], me, 0)
            recv.Wait(status)
            send.Wait()
            info, _ = memo.decode(inbox, status.Get_count(BYTE), NO_LIMIT)
            np.copyto(out, np.frombuffer(inbox, info.dtype, out.size, info.header_nbytes).reshape(info.shape))
            Array.over_host(out, status.Get_source(), status.Get_tag(), None)

    def body_nb(n: int) -> None:
        for _ in range(n):
            # irecv_array(me, tag, out=out) and isend_array(x, me, tag): their own argument checks and plans
            pc, source, rtag, target, _, rt = _receive_args("irecv_array", me, tag, None, out, None)
            inbox = take_inbox()
            recv = pc.header.Irecv(inbox.msg, source, rtag)
            cfg = config()
            spc, dest, stag, plan, _ = _outbound("isend_array", x, me, tag, None, None, None, cfg)
            assert plan is not None
            sends = post_send(plan, spc, dest, stag, NONBLOCKING)
            # waitall
            recv.Wait(inbox.status)
            MPI.Request.Waitall(sends)
            try:
                plan_recv("irecv_array", inbox, target, None, pc, cfg, rt)
            finally:
                give_back_inbox(inbox)

    def cai_nb(n: int) -> None:
        for _ in range(n):
            waitall([irecv_array(me, 0, out=out), isend_array(x, me, 0)])

    tx, rx = send_channel(x, me, 1), recv_channel(me, 1, out=out)

    def channel_nb(n: int) -> None:
        for _ in range(n):
            waitall([rx.irecv(), tx.isend()])

    runs: dict[str, Callable[[int], None]] = {"raw-nb": raw_nb, "wire-nb": wire_nb, "body-nb": body_nb,
                                              "cai-nb": cai_nb, "channel-nb": channel_nb}
    for run in runs.values():
        run(args.pairs // 10)  # warm-up
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(args.reps):
        for mode, run in runs.items():  # (interleaved: a slow spell of the machine hits every mode alike)
            t = time.thread_time()
            run(args.pairs)
            best[mode] = min(best[mode], (time.thread_time() - t) / args.pairs * 1e6)
    print("| mode | CPU us per pair | / raw-nb |\n| --- | ---: | ---: |")
    for mode, us in best.items():
        print(f"| {mode} | {us:.2f} | {us / best['raw-nb']:.1f}x |")
    tx.close()
    rx.close()
    if args.json:
        with open(args.json, "w") as f:
            library = MPI.Get_library_version().splitlines()[0].rstrip("\x00")
            json.dump({"pairs": args.pairs, "reps": args.reps, "mpi": library, "cpu_us_per_pair": best}, f, indent=1)


if __name__ == "__main__":
    main()
