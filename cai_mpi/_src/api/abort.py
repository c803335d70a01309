"""A job that fails loudly: an uncaught exception on one rank prints the rank and the traceback, then aborts
MPI_COMM_WORLD, so the other ranks do not wait for it forever (MPI has no way to tell them otherwise)."""

from __future__ import annotations

import array
import os
import signal
import socket
import stat
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import TracebackType

from mpi4py import MPI

__all__ = ["abort_on_error", "abort_with_report", "exit_status"]

_SysHook = Callable[[type[BaseException], BaseException, "TracebackType | None"], object]
_ThreadHook = Callable[[threading.ExceptHookArgs], object]

# The hooks abort_on_error replaced: they still print the traceback, so a hook installed before it keeps its
# format. None until abort_on_error is called (which makes calling it twice harmless).
_previous: tuple[_SysHook, _ThreadHook] | None = None

# How long an abort waits for the launcher to read this rank's last output (see _let_the_launcher_read).
_OUTPUT_DRAIN_SECONDS = 2.0


def exit_status(error: BaseException) -> int:
    """The job's exit status for ``error``, as ``python -m mpi4py`` picks it.

    SystemExit keeps its code (None is 0, a message is 1), KeyboardInterrupt is 128 + SIGINT, anything else 1.
    """
    if isinstance(error, SystemExit):
        code = error.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    if isinstance(error, KeyboardInterrupt):
        return 128 + signal.SIGINT
    return 1


def _mpi_running() -> bool:
    return bool(MPI.Is_initialized()) and not MPI.Is_finalized()


def _headline(error: BaseException, status: int, thread: threading.Thread | None) -> str:
    world = MPI.COMM_WORLD
    where = f" in thread {thread.name!r}" if thread is not None else ""
    first_line = (str(error).splitlines() or [""])[0]
    message = f"{type(error).__name__}: {first_line}" if first_line else type(error).__name__
    return (
        f"cai_mpi: rank {world.Get_rank()} of {world.Get_size()} (host {socket.gethostname()}){where}: "
        f"uncaught {message}, aborting MPI_COMM_WORLD (exit status {status})\n"
    )


def _flush_quietly() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed or broken stream must not stop the abort
            pass


def _unread_bytes(fd: int) -> int:
    import fcntl  # (POSIX only: imported here so that importing cai_mpi does not depend on it)
    import termios

    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count, True)
    return count[0]


def _let_the_launcher_read() -> None:
    # MPI_Abort makes the launcher kill every rank, and the launcher may stop forwarding a rank's output before
    # it has read what the rank wrote last (MPICH's hydra loses it on a busy machine): wait, briefly, until the
    # pipes to the launcher are empty. FIONREAD counts the unread bytes of a pipe from either end.
    deadline = time.monotonic() + _OUTPUT_DRAIN_SECONDS
    for fd in (1, 2):
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                continue
            while _unread_bytes(fd) > 0 and time.monotonic() < deadline:
                time.sleep(0.01)
        except (OSError, ImportError):
            continue


def abort_with_report(error: BaseException, thread: threading.Thread | None = None) -> None:
    """Print this rank, its host and ``error``'s traceback to stderr, then abort MPI_COMM_WORLD.

    The traceback is printed by the hook abort_on_error replaced (Python's own unless something else had been
    installed). Returns only when there is nothing to abort: a SystemExit with status 0 (a normal exit), or
    MPI not running (then only the traceback is printed).

    Args:
        error: the uncaught exception, with its ``__traceback__``.
        thread: the thread it ended, if not the main thread.
    """
    status = exit_status(error)
    if status == 0:
        return
    sys_hook, thread_hook = _previous or (sys.__excepthook__, threading.__excepthook__)
    _flush_quietly()
    if _mpi_running():
        sys.stderr.write(_headline(error, status, thread))
    try:
        if thread is None:
            sys_hook(type(error), error, error.__traceback__)
        else:
            thread_hook(threading.ExceptHookArgs([type(error), error, error.__traceback__, thread]))
    except Exception:  # a hook that fails must not stop the abort: Python's own printing instead
        traceback.print_exception(error)
    _flush_quietly()
    if _mpi_running():
        _let_the_launcher_read()
        MPI.COMM_WORLD.Abort(status)


def _sys_excepthook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
    abort_with_report(error.with_traceback(tb))


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    # A SystemExit ends only its thread, as without abort_on_error (threading ignores it).
    if args.exc_value is None or isinstance(args.exc_value, SystemExit):
        if _previous is not None:
            _previous[1](args)
        return
    abort_with_report(args.exc_value.with_traceback(args.exc_traceback), args.thread or threading.current_thread())


def abort_on_error() -> None:
    """Make an uncaught exception on this rank end the whole MPI job at once, with its rank and traceback on stderr.

    Call it once near the top of a program, on every rank (calling it again does nothing). It installs
    ``sys.excepthook`` and ``threading.excepthook``: an exception that escapes the main thread or any other
    thread prints ``cai_mpi: rank R of N (host H): uncaught ...`` and the traceback (through the hooks it
    replaced), then calls ``MPI.COMM_WORLD.Abort`` with status 1 (130 for Ctrl-C). Without it, a rank that dies
    of an exception leaves the others blocked in their next receive or collective until the job's time limit.

    ``sys.exit(n)`` is not an exception Python hands to a hook: a rank that calls it while the others wait for
    it still hangs the job (in ``MPI_Finalize``). ``python -m cai_mpi run script.py`` covers that too (status n),
    and needs no change to the script.

    Example:
        >>> import cai_mpi
        >>> cai_mpi.abort_on_error()  # doctest: +SKIP
    """
    global _previous
    if _previous is not None:
        return
    _previous = (sys.excepthook, threading.excepthook)
    sys.excepthook = _sys_excepthook
    threading.excepthook = _thread_excepthook
