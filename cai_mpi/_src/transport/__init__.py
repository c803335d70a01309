"""The transport: one send pipeline and one receive pipeline, and the only module that posts payload MPI
operations.

Sending is ``plan_send``: it chooses, once, how the bytes travel (inline in the header; directly from host
or, through a CUDA-aware MPI, device memory; through a derived datatype; in chunks; packed on the device;
staged through pinned host memory) and returns a ``SendPlan``: the header, the payload messages to post at
once, and the steps left to drive (device packing, staging), which run up to ``PREPARED`` before the header
is posted (a send either posts nothing or completes the protocol: ``failure.py``). Receiving is
``plan_recv``: given a header, it checks it against ``out=``, chooses where the bytes land and returns a
``RecvPlan`` the same way. ``post.py`` posts both, with one body per direction and a ``Poster`` that says how:
blocking ``Send``/``Recv``, nonblocking ``Isend``/``Irecv`` driven by a Request, or persistent
``Send_init``/``Recv_init`` for channels (mpi4py's ``util.pkl5`` passes its ``send`` callback the same way).
The point-to-point API modules validate arguments and choose a poster; they post nothing themselves. Steady-state
traffic between a pair of ranks is a described stream, described once through that one path: a channel's is bound
in place (``bound.py``: each later message restarts its persistent payload request); a ``Pipeline`` edge's
(``stream.py``) moves bare payloads into a ring of persistent receives, with credits for back-pressure, on a chain
of ranks (``chain.py``: its communicators, opening and leaving); a failing stage tells the others through
``notices.py``. Collectives move each rank's payload as one contiguous piece (``contiguous.py``) through MPI's
collectives (``bigcount.py``).
"""
from __future__ import annotations

from .contiguous import Gathered, Landing, Outgoing, outgoing
from .failure import PREPARED
from .pieces import device_landing, internal_stream
from .plans import RecvPlan, SendPlan
from .post import (
    BLOCKING,
    NONBLOCKING,
    PERSISTENT,
    Poster,
    ireceive,
    isend_plan,
    post_send,
    receive,
    receive_steps,
)
from .receive import Inbox, give_back_inbox, header_failure, plan_recv, take_inbox
from .send import plan_object, plan_send, staged_source

__all__ = [
    "BLOCKING", "NONBLOCKING", "PERSISTENT", "PREPARED", "Gathered", "Inbox", "Landing", "Outgoing", "Poster",
    "RecvPlan", "SendPlan", "device_landing", "give_back_inbox", "header_failure", "internal_stream", "ireceive",
    "isend_plan", "outgoing", "plan_object", "plan_recv", "plan_send", "post_send", "receive", "receive_steps",
    "staged_source", "take_inbox",
]
