"""A request shared by threads: one thread drives it at a time, the others wait for it (or, polling it for the
progress rule, pass it by), and every waiter gets the one result. Steps stand in for MPI here."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator

import numpy as np
from mpi4py import MPI

import cai_mpi
from cai_mpi._src.progress.requests import Request
from cai_mpi._src.progress.waits import Waitable

me = MPI.COMM_WORLD.Get_rank()


class Gate(Waitable):
    """A step that completes once ``opened``; counts the threads blocked in its ``wait``."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.waiting = 0

    def test(self) -> bool:
        return self.event.is_set()

    def wait(self) -> None:
        self.waiting += 1
        self.event.wait()


def until_a_thread_waits(gate: Gate) -> None:
    """Until some thread is blocked in the gate (a started thread may take a while to get there on a busy machine)."""
    give_up = time.monotonic() + 30
    while not gate.waiting and time.monotonic() < give_up:
        time.sleep(1e-3)


def steps(gate: Gate, ran: list[str]) -> Generator[Waitable, None, str]:
    yield gate
    ran.append("landed")
    return "data"


def test_threads_waiting_for_one_request_all_get_its_result_and_its_steps_run_once() -> None:
    gate, ran = Gate(), []
    req = Request(steps(gate, ran))
    results: list[object] = []

    def waiter() -> None:
        try:
            results.append(req.wait())
        except BaseException as exc:  # (a generator driven by two threads at once raises here)
            results.append(exc)

    threads = [threading.Thread(target=waiter) for _ in range(3)]
    for th in threads:
        th.start()
    until_a_thread_waits(gate)
    time.sleep(0.2)  # (time for a second thread to drive it too, were that possible)
    assert gate.waiting == 1, f"{gate.waiting} threads drove the same request at once"
    gate.event.set()
    for th in threads:
        th.join(timeout=10)
    assert not any(th.is_alive() for th in threads), "a waiter hung"
    assert results == ["data"] * 3 and ran == ["landed"]


def test_a_test_from_another_thread_never_drives_a_request_a_thread_is_driving() -> None:
    gate, ran = Gate(), []
    req = Request(steps(gate, ran))
    waiter = threading.Thread(target=req.wait)
    waiter.start()
    until_a_thread_waits(gate)  # (the waiter drives the request: only then may the test come)
    tested: list[tuple[bool, object]] = []
    tester = threading.Thread(target=lambda: tested.append(req.test()))
    tester.start()
    time.sleep(0.1)
    gate.event.set()
    waiter.join(timeout=10)
    tester.join(timeout=10)
    assert tested == [(True, "data")] and ran == ["landed"] and gate.waiting == 1


def test_threads_exchanging_through_their_own_requests_drive_each_other() -> None:
    """Each thread's waits poke the others' pending requests (the progress rule), which are taken by their own
    threads part of the time: every exchange completes, with its own data."""
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        return
    comm = MPI.COMM_WORLD
    failures: list[BaseException] = []

    def exchange(t: int) -> None:
        try:
            for i in range(200):
                x = np.full(3, t * 1000 + i, dtype=np.int64)
                got, _ = cai_mpi.waitall([cai_mpi.irecv_array(me, 100 + t, comm), cai_mpi.isend_array(x, me, 100 + t,
                                                                                                      comm)])
                assert np.asarray(got).tolist() == x.tolist()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=exchange, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads), "threads hung"
    assert failures == []
