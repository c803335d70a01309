"""The transport: one send pipeline and one receive pipeline, and the only module that posts payload MPI
operations.

Sending is ``plan_send``: it chooses, once, how the bytes travel (inline in the header; directly from host
or, through a CUDA-aware MPI, device memory; through a derived datatype; in chunks; packed on the device;
staged through pinned host memory) and returns an ``Outbound``: the header, the payload messages to post
at once, and the steps left to drive (device packing, staging), which run up to ``PREPARED`` before the
header is posted (a send either posts nothing or completes the protocol: ``failure.py``). Receiving is
``plan_recv``: given a header, it checks it against ``out=``, chooses where the bytes land and returns an
``Inbound`` the same way. Blocking, nonblocking and channel calls differ only in how they post those
messages (``Send`` or ``Isend``, ``Recv``/``Irecv`` or ``Recv_init``), as mpi4py's ``util.pkl5`` does with
its ``send`` callback.
"""
from __future__ import annotations

from .contiguous import Gathered, Landing, Outgoing, outgoing
from .failure import PREPARED
from .pieces import internal_stream
from .receive import Inbound, Inbox, give_back_inbox, header_failure, plan_recv, take_inbox
from .send import Outbound, plan_send

__all__ = [
    "PREPARED", "Gathered", "Inbound", "Inbox", "Landing", "Outbound", "Outgoing", "give_back_inbox", "header_failure",
    "internal_stream", "outgoing", "plan_recv", "plan_send", "take_inbox",
]
