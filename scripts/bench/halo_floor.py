"""The floor of a self-describing face exchange, with the payload receive posted after the header arrives (the
protocol today) or with it (issue 43's "payload posted early"), side by side with the call itself.

    mpiexec -n 2 python scripts/bench/halo_floor.py [NBYTES] [ROUNDS] [CALLS]

Two ranks exchange a face of NBYTES each way, interleaved round after round, in mpi4py alone:

- ``raw``: ``Irecv`` + ``Isend`` of the payload into known buffers, one ``Waitall``;
- ``header, then the payload``: a 64-byte header naming the payload's tag and the payload on two duplicates (as
  cai_mpi's wire: docs/protocol.md); the receiver waits for the header, reads the tag, then posts the payload's
  ``Irecv``: the least any header-then-payload protocol costs;
- ``header with the payload``: the same messages, the payload's ``Irecv`` posted with the header's (a tag the
  receiver predicts): the least early posting could reach;
- ``irecv_array(out=) + isend_array``: cai_mpi's one-shot calls and ``waitall``.

Prints on rank 0 each mode's median time per exchange (us) and its ratio to raw's time, as JSON. Defaults: 1 MiB,
9 rounds of 100 exchanges.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import numpy as np
from interleaved import median_us  # (scripts/bench, this script's folder)
from mpi4py import MPI

import cai_mpi


def main() -> None:
    given = [int(a) for a in sys.argv[1:4]]
    nbytes, rounds, calls = given + [1 << 20, 9, 100][len(given):]
    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        raise SystemExit("halo_floor.py: run it on 2 ranks")
    peer = 1 - comm.Get_rank()
    headers, payloads = comm.Dup(), comm.Dup()
    face = np.arange(max(nbytes // 8, 1), dtype=np.float64)
    ghost = np.empty_like(face)
    header_out, header_in = np.zeros(8, np.int64), np.zeros(8, np.int64)
    counter = [0]

    def next_tag() -> int:
        counter[0] = counter[0] % 32767 + 1  # (both ranks count alike: each predicts the other's tag)
        return counter[0]

    def raw() -> None:
        MPI.Request.Waitall([comm.Irecv(ghost, peer, 0), comm.Isend(face, peer, 0)])

    def header_then_payload() -> None:
        header_out[0] = tag = next_tag()
        got = headers.Irecv(header_in, peer, 0)
        sends = [headers.Isend(header_out, peer, 0), payloads.Isend(face, peer, tag)]
        got.Wait()
        MPI.Request.Waitall([payloads.Irecv(ghost, peer, int(header_in[0])), *sends])

    def header_with_payload() -> None:
        header_out[0] = tag = next_tag()
        MPI.Request.Waitall([headers.Irecv(header_in, peer, 0), payloads.Irecv(ghost, peer, tag),
                             headers.Isend(header_out, peer, 0), payloads.Isend(face, peer, tag)])

    def cai() -> None:
        cai_mpi.waitall([cai_mpi.irecv_array(peer, 0, out=ghost), cai_mpi.isend_array(face, peer, 0)])

    modes: dict[str, Callable[[], None]] = {
        "raw": raw,
        "header, then the payload": header_then_payload,
        "header with the payload": header_with_payload,
        "irecv_array(out=) + isend_array": cai,
    }
    median = median_us(comm, modes, rounds, calls)
    if comm.Get_rank() == 0:
        print(json.dumps({"nbytes": face.nbytes, "rounds": rounds, "calls": calls, "us": median,
                          "x raw time": {name: m / median["raw"] for name, m in median.items()}}, indent=1))
    headers.Free()
    payloads.Free()


if __name__ == "__main__":
    main()
