"""Interpreter exit with cai_mpi requests still pending: no crash, no hang, and no memory MPI may still touch is
freed before MPI finalizes.

mpi4py finalizes MPI from ``Py_AtExit``, after Python's teardown has freed what it could; a request still pending
then (never waited, dropped, a channel never closed) still has MPI reading or writing its memory until
``MPI_Finalize``. Each buffer here is a numpy subclass whose ``__del__`` reports being freed while MPI is active,
which a weak reference cannot do (weakref callbacks do not run during teardown). A control array held by nothing
but a global shows the report works. Each scenario runs as its own job, with this venv's MPI, at 2 and 3 ranks.
"""

from __future__ import annotations

import pytest
from launch import Finished, run_ranks

PROGRAM = r"""
import atexit, ctypes, os, sys, types, weakref


def clear_cai_mpi_globals():
    # What CPython's teardown does to a module still alive, in an order it does not promise: every global
    # becomes None. Registered before cai_mpi is imported, this runs after cai_mpi's own atexit hooks.
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "cai_mpi":
            names = vars(module)
            for key in list(names):
                if key != "__builtins__":
                    names[key] = None


if sys.argv[2:] == ["cai_mpi's globals cleared first"]:
    atexit.register(clear_cai_mpi_globals)


def wait_late():
    # An exit hook of another library, registered before cai_mpi was imported: it runs after cai_mpi's own.
    for req in late_waits:
        req.wait(30)
    if late_waits:
        intact = bool((np.asarray(receiver_out) == 1.0).all())
        print(f"rank {rank}: late waits done, the message arrived {'intact' if intact else 'NOT'}", flush=True)


late_waits = []
atexit.register(wait_late)

import numpy as np
from mpi4py import MPI
import cai_mpi

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
right, left = (rank + 1) % size, (rank - 1) % size
N = 1 << 20  # 8 MiB of float64: sent by rendezvous, so a send stays in flight until its receiver comes


# Weak references that outlive teardown (one reference nobody drops), so that their callbacks run when an array is
# really freed. __del__ alone cannot tell: the garbage collector calls it on a whole cycle of garbage before it
# finds that something there (a pending request, at exit) was kept alive after all.
watchers = []
ctypes.pythonapi.Py_IncRef(ctypes.py_object(watchers))


def watch(self, _finalized=MPI.Is_finalized, _write=os.write, _ref=weakref.ref, _watchers=watchers,
          _getattr=getattr, _rank=rank):
    label = _getattr(self, "label", "?")

    def freed(_):
        if not _finalized():
            _write(2, f"rank {_rank}: {label} freed while MPI ACTIVE\n".encode())
    _watchers.append(_ref(self, freed))


class Watched(np.ndarray):
    # Its globals are a dict of its own: through __main__'s, every Watched array would make a cycle with
    # __main__'s globals that teardown may never free.
    __del__ = types.FunctionType(watch.__code__, {}, "__del__", watch.__defaults__, watch.__closure__)


def watched(label, n=N, fill=1.0):
    arr = np.full(n, fill).view(Watched)
    arr.label = label
    return arr


control = watched("the control array", 4)  # nothing pending: must be reported
case = sys.argv[1]
if case == "isend never received":
    pending = [cai_mpi.isend_array(watched("an unreceived isend buffer"), dest, 5)
               for dest in range(size) if dest != rank]
elif case == "ring in flight":  # every rank sends right and receives from the left; nobody waits
    recv = cai_mpi.irecv_array(left, 6, out=watched("an irecv out= buffer", fill=0.0))
    send = cai_mpi.isend_array(watched("an isend buffer"), right, 6)
elif case == "strided ring in flight":  # packed before sending: the request owns a temporary and the view's base
    recv = cai_mpi.irecv_array(left, 7)
    send = cai_mpi.isend_array(watched("a strided view's base", 2 * N)[::2], right, 7)
elif case == "dropped":  # references dropped at once
    cai_mpi.irecv_array(left, 8, out=watched("a dropped irecv's out= buffer", fill=0.0))
    cai_mpi.isend_array(watched("a dropped isend buffer"), right, 8)
elif case == "irecv never matched":  # still posted at exit, as an MPI receive would be
    recv = cai_mpi.irecv_array(left, 9, out=watched("an unmatched irecv's out= buffer", fill=0.0))
elif case == "channels never closed":
    sender = cai_mpi.send_channel(watched("a channel's send buffer"), right, 10)
    receiver = cai_mpi.recv_channel(left, 10, out=watched("a channel's receive buffer", fill=0.0))
    first = sender.isend()  # (a ring of blocking sends would deadlock)
    receiver.recv()
    first.wait()
    sending, receiving = sender.isend(), receiver.irecv()
elif case == "channels waited in a later exit hook":  # complete by teardown: their buffers may then go
    sender = cai_mpi.send_channel(watched("(completed) a channel's send buffer"), right, 13)
    receiver_out = watched("(completed) a channel's receive buffer", fill=0.0)
    receiver = cai_mpi.recv_channel(left, 13, out=receiver_out)
    world.Barrier()
    late_waits += [sender.isend(), receiver.irecv()]
elif case == "a channel whose close timed out":  # its send stays posted; the channel and the buffer are dropped
    sender = cai_mpi.send_channel(watched("a timed-out channel's send buffer"), right, 15)
    for wait in (sender.send, sender.close):
        try:
            wait(timeout=0.2)
            raise SystemExit(f"{wait.__name__}: expected a timeout")
        except cai_mpi.TimeoutError as exc:
            exc.__traceback__ = None  # (the pending send keeps its error: its frames would keep this module's globals)
    del sender, wait
    cai_mpi.irecv_array(MPI.PROC_NULL).wait()  # (any cai_mpi wait drives what the timeouts left behind)
elif case == "a received array kept":  # a pooled block, given back to its pool during teardown
    send = cai_mpi.isend_array(np.ones(1 << 17), right, 14)
    kept = cai_mpi.recv_array(left, 14)
    send.wait()
elif case == "MPI finalized by the user":  # MPI gone first: freeing afterwards is safe, and must not fail
    send = cai_mpi.isend_array(watched("an isend buffer"), right, 11)
    recv = cai_mpi.irecv_array(left, 11, out=watched("an irecv out= buffer", fill=0.0))
    world.Barrier()
    MPI.Finalize()
    control = None  # (freed after MPI_Finalize: nothing to report)
    print(f"rank {rank}: finalized", flush=True)
    sys.exit(0)
elif case == "a persistent collective open when the user finalizes MPI":  # its requests are MPI's no more
    import numpy as np
    coll = cai_mpi.allreduce_init(np.ones(4))  # (never started: exit frees its requests, unless MPI is gone)
    world.Barrier()
    MPI.Finalize()
    print(f"rank {rank}: finalized", flush=True)
    sys.exit(0)
elif case == "a persistent collective closed after the user finalizes MPI":  # closing frees nothing then
    import numpy as np
    coll = cai_mpi.allreduce_init(np.ones(4))  # (never started)
    world.Barrier()
    MPI.Finalize()
    coll.close()
    print(f"rank {rank}: finalized", flush=True)
    sys.exit(0)
elif case == "a raw mpi4py receive":  # the check's own test: mpi4py frees this buffer while MPI is active
    raw = world.Irecv(watched("a raw mpi4py receive's buffer", fill=0.0), left, 12)
else:
    raise SystemExit(f"unknown case {case!r}")
world.Barrier()
print(f"rank {rank}: exiting", flush=True)
"""

CASES = ["isend never received", "ring in flight", "strided ring in flight", "dropped", "irecv never matched",
         "channels never closed", "channels waited in a later exit hook", "a channel whose close timed out",
         "a received array kept", "MPI finalized by the user",
         "a persistent collective open when the user finalizes MPI",
         "a persistent collective closed after the user finalizes MPI"]
ORDERS = ["natural", "cai_mpi's globals cleared first"]
JOBS = [(case, 2, order) for case in CASES for order in ORDERS] + [(case, 3, ORDERS[0]) for case in CASES]


def run(case: str, nprocs: int, order: str) -> tuple[Finished, list[str]]:
    """The job's result, and what its ranks reported freed while MPI was active (but what MPI was done with)."""
    done = run_ranks(nprocs, ["-c", PROGRAM, case, order], timeout=60)
    assert done.returncode == 0 and done.seconds < 30, done.output
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.output
    freed = [line for line in done.stderr.splitlines()
             if "freed while MPI ACTIVE" in line and "(completed)" not in line]
    return done, sorted(freed)


@pytest.mark.parametrize(("case", "nprocs", "order"), JOBS, ids=[f"{c}-{n}-{o}" for c, n, o in JOBS])
def test_exit_with_requests_pending(case: str, nprocs: int, order: str) -> None:
    done, freed = run(case, nprocs, order)
    finalized = case in ("MPI finalized by the user", "a persistent collective open when the user finalizes MPI",
                         "a persistent collective closed after the user finalizes MPI")
    said = "finalized" if finalized else "exiting"
    assert all(f"rank {r}: {said}" in done.stdout for r in range(nprocs)), done.output
    expected = [] if finalized else [
        f"rank {r}: the control array freed while MPI ACTIVE" for r in range(nprocs)]
    assert freed == expected, done.output
    if case == "channels waited in a later exit hook":  # the waits saw the messages really arrive
        for r in range(nprocs):
            assert f"rank {r}: late waits done, the message arrived intact" in done.stdout, done.output


def test_the_check_sees_memory_freed_under_a_pending_request() -> None:
    """Without cai_mpi, mpi4py frees a pending receive's buffer at teardown, while MPI is active: reported."""
    done, freed = run("a raw mpi4py receive", 2, ORDERS[0])
    assert "rank 0: a raw mpi4py receive's buffer freed while MPI ACTIVE" in freed, done.output
