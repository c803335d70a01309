"""`python -m cai_mpi soak`: every rank sends to and receives from every other, in every way cai_mpi offers, from
several threads, until N messages have arrived; each one is checked by content hash, and resident memory is
sampled to show it stays flat. Exit status 1 on any failure."""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import threading
import time
import traceback
from collections import Counter

from mpi4py import MPI

from ...progress.driving import pending_count
from ...runtime import get_runtime
from ...transport.pool import idle_pooled_bytes
from ...transport.privcomm import cuda_aware
from .. import simulated
from ..bench.cli import parse_size
from ..bench.progress import Progress
from .report import SCHEMA, Sample, memory_allowance, memory_failures, memory_summary, plot, render
from .rounds import KINDS, Worker, kind_of, round_messages

__all__ = ["main"]

_EXAMPLES = """examples:
  mpiexec -n 4 python -m cai_mpi soak                       # 10,000 messages, 2 threads per rank
  mpiexec -n 4 python -m cai_mpi soak --messages 100000 --json soak.json
  mpiexec -n 3 python -m cai_mpi soak --simulated-gpu --max-bytes 4M   # GPU paths on a simulated GPU

Each thread works on its own duplicate of COMM_WORLD; every rank runs the same seeded schedule of rounds
(exchange, wildcard, channel, collective). Failures must be 0, and resident memory flat after the warm-up."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cai_mpi soak", description=__doc__, epilog=_EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=10_000, help="arrays to deliver over all ranks (default 10000)")
    p.add_argument("--max-bytes", type=parse_size, default=32 << 20, help="largest message (default 32M)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads per rank (default 2 under MPI.THREAD_MULTIPLE, else 1)")
    p.add_argument("--seed", type=int, default=1, help="the schedule's seed (default 1)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds any one wait (or closing a thread's channels) may take before the run fails "
                        "instead of hanging; a thread that finishes no round for three times this is reported stuck "
                        "and the job aborted (default 300)")
    p.add_argument("--warmup", type=float, default=0.2, help="fraction of the run before memory must be flat")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON (rank 0)")
    p.add_argument("--plot", metavar="PNG", help="draw each rank's memory over the run (needs matplotlib)")
    simulated.add_flag(p)
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None, help="always draw progress")
    bar.add_argument("--no-progress", dest="progress", action="store_false", help="never draw progress")
    return p


class MemorySampler(threading.Thread):
    """Resident memory, the part of it cai_mpi's pools hold idle for reuse, and live Python objects, every
    ``interval`` seconds, from a thread of its own."""

    def __init__(self, interval: float = 0.25) -> None:
        super().__init__(daemon=True, name="soak-memory")
        self.interval = interval
        self.samples: list[Sample] = []
        self._stop_event = threading.Event()
        self._t0 = time.monotonic()

    def sample(self) -> None:
        self.samples.append((time.monotonic() - self._t0, resident_mib(), pooled_mib(), len(gc.get_objects())))

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        self.sample()


def pooled_mib() -> float:
    """Idle blocks kept for reuse by the host receive pool and the pinned staging pools (bounded by budgets)."""
    return idle_pooled_bytes() / 2**20


def resident_mib() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # not Linux: the peak is what there is
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10)


def _plan(seed: int, thread: int, share: int, n: int) -> int:
    """Rounds thread ``thread`` runs for at least ``share`` messages (the same on every rank)."""
    rounds = total = 0
    while total < share:
        total += round_messages(*kind_of(seed, thread, rounds), n)
        rounds += 1
    return rounds


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    args.command = " ".join(["python -m cai_mpi soak", *argv])
    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    if n < 2:
        print("python -m cai_mpi soak: run it on 2 or more ranks (mpiexec -n 4 python -m cai_mpi soak)",
              file=sys.stderr)
        return 2
    multiple = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
    threads = args.threads if args.threads is not None else 2 if multiple else 1
    if threads > 1 and not multiple:
        print(f"--threads {threads} needs MPI.THREAD_MULTIPLE; this MPI gives level {MPI.Query_thread()}",
              file=sys.stderr)
        return 2
    runtime = (simulated.install() if args.simulated_gpu else get_runtime()).name
    comms = [world.Dup() for _ in range(threads)]
    for comm in comms:
        cuda_aware(comm)  # a communicator's first use by cai_mpi is collective: done here, not in the threads
    workers = [Worker(t, comm, args.seed, args.max_bytes, args.timeout, runtime) for t, comm in enumerate(comms)]
    share = -(-args.messages // threads)
    plans = [_plan(args.seed, t, share, n) for t in range(threads)]
    progress = Progress(args.progress if rank == 0 else False)
    progress.start(sum(plans))
    lock = threading.Lock()
    errors: list[str] = []
    moved = [time.monotonic()] * threads  # when each thread last finished a round
    current = [0] * threads

    def work(worker: Worker, rounds: int) -> None:
        try:
            for rnd in range(rounds):
                current[worker.thread] = rnd
                worker.run(rnd)
                moved[worker.thread] = time.monotonic()
                with lock:
                    progress.advance(1, f"round {rnd + 1}/{rounds} {kind_of(args.seed, worker.thread, rnd)[0]}")
        except Exception:  # the others then time out waiting for this rank: the run ends, and says why
            errors.append(f"rank {rank} thread {worker.thread}: {traceback.format_exc()}")
        finally:
            worker.close()

    sampler = MemorySampler()
    sampler.sample()
    sampler.start()
    world.Barrier()
    t0 = time.perf_counter()
    # Daemon threads: one stuck in a wait that ignores --timeout must not keep the process alive.
    pool = [threading.Thread(target=work, args=(w, r), name=f"soak-{w.thread}", daemon=True)
            for w, r in zip(workers, plans)]
    for thread in pool:
        thread.start()
    stall = 3 * args.timeout
    stuck = _join(pool, moved, stall)
    for t in stuck:
        errors.append(f"rank {rank} thread {t}: round {current[t]} ({kind_of(args.seed, t, current[t])[0]}) has "
                      f"finished nothing for {stall:g} s: stuck in a wait that does not honour --timeout; the job is "
                      "aborted after this report")
    seconds = time.perf_counter() - t0
    progress.close()
    gc.collect()
    sampler.stop()
    leaks = _leaks()
    if not stuck:  # (a stuck thread may still be inside a call on its communicator)
        for comm in comms:
            comm.Free()
    status = _report(args, world, workers, errors, leaks, sampler.samples, seconds, threads, runtime)
    if stuck:  # MPI_Finalize would wait for the stuck thread: end the job, now that the report is out
        sys.stdout.flush()
        sys.stderr.flush()
        world.Abort(1)
    return status


def _join(pool: list[threading.Thread], moved: list[float], stall: float) -> list[int]:
    """Wait for every thread; stop waiting for one that has finished no round for ``stall`` seconds (when a peer
    fails, each of a round's waits ends within --timeout, and closing the channels within one more). Returns the
    stuck threads' numbers."""
    stuck: list[int] = []
    while True:
        waiting = [t for t, thread in enumerate(pool) if thread.is_alive() and t not in stuck]
        if not waiting:
            return stuck
        stuck += [t for t in waiting if time.monotonic() - moved[t] > stall]
        pool[waiting[0]].join(0.25)


def _leaks() -> list[str]:
    """What should be gone once every worker has finished and closed its channels."""
    from ...api.channel import open_channel_count
    from ...progress.requests import Request

    found = []
    if pending_count():
        found.append(f"{pending_count()} request(s) still pending")
    live = sum(isinstance(o, Request) for o in gc.get_objects())
    if live:
        found.append(f"{live} Request object(s) still alive")
    if open_channel_count():
        found.append(f"{open_channel_count()} channel(s) still open")
    return found


def _report(args: argparse.Namespace, world: MPI.Intracomm, workers: list[Worker], errors: list[str],
            leaks: list[str], samples: list[Sample], seconds: float, threads: int,
            runtime: str) -> int:
    rank, n = world.Get_rank(), world.Get_size()
    messages: Counter[str] = Counter()
    nbytes: Counter[str] = Counter()
    memory = memory_summary(samples, args.warmup)
    allowance = memory_allowance(args.max_bytes, threads)
    failures = list(errors) + [f"rank {rank}: {leak}" for leak in [*leaks, *memory_failures(memory, allowance)]]
    for w in workers:
        messages.update(w.messages)
        nbytes.update(w.bytes)
        failures += [f"rank {rank} thread {w.thread}: {f}" for f in w.failures]
    mine = {"messages": dict(messages), "bytes": dict(nbytes), "failures": failures, "memory": memory,
            "rss_series_mib": [[round(t, 2), round(rss, 1), round(pooled, 1)] for t, rss, pooled, _ in samples]}
    everyone = world.gather(mine, root=0)
    if rank != 0:
        return 1 if world.bcast(None, root=0) else 0
    assert everyone is not None
    total_msgs: Counter[str] = Counter()
    total_bytes: Counter[str] = Counter()
    all_failures: list[str] = []
    for r in everyone:
        total_msgs.update(r["messages"])
        total_bytes.update(r["bytes"])
        all_failures += r["failures"]
    result = {
        "schema": SCHEMA, "ranks": n, "threads": threads, "runtime": runtime, "seed": args.seed,
        "max_bytes": args.max_bytes, "seconds": round(seconds, 2),
        "mpi_library_version": _mpi_name(),
        "python": platform.python_version(), "platform": platform.platform(),
        "messages": sum(total_msgs.values()), "bytes": sum(total_bytes.values()),
        "by_kind": {k: {"messages": total_msgs[k], "bytes": total_bytes[k]} for k in KINDS},
        "failures": len(all_failures), "failure_details": all_failures[:50],
        "memory_per_rank": [r["memory"] for r in everyone], "memory_allowance": allowance,
        "rss_series_mib": [r["rss_series_mib"] for r in everyone],
        "command": args.command,
    }
    print(render(result), flush=True)  # (before any rank may abort the job: see main)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    if args.plot:
        plot(result, args.plot)
    world.bcast(bool(all_failures), root=0)
    return 1 if all_failures else 0


def _mpi_name() -> str:
    """The MPI library's first words: 'Open MPI v5.0.11', 'MPICH Version: 5.0.2'."""
    return " ".join(MPI.Get_library_version().replace("\x00", "").splitlines()[0].split(",")[0].split())
