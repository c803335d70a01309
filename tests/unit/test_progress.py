"""The progress bar of bench and soak: drawn on a terminal (or when asked), never into a pipe or a log."""

from __future__ import annotations

import io
import os
import threading

from cai_mpi._src.cli.bench.progress import Progress


def test_nothing_is_written_when_the_stream_is_no_terminal() -> None:
    log = io.StringIO()
    p = Progress(None, log, delay=0.0, interval=0.0)
    p.start(10)
    p.status("latency 8 B")
    p.advance(5, "latency 8 B cai")
    p.close()
    assert not p.enabled and log.getvalue() == ""


def test_a_forced_bar_shows_percentage_and_label_then_is_erased() -> None:
    log = io.StringIO()
    p = Progress(True, log, delay=0.0, interval=0.0)
    p.start(1e12)  # bench counts estimated work, not items
    p.advance(2.5e11, "bw 1 MiB cai sample 1/5")
    drawn = log.getvalue()
    assert "\r" in drawn and " 25%|" in drawn and "bw 1 MiB cai sample 1/5" in drawn, repr(drawn)
    assert "bw 1 MiB cai sample 1/5" in p.line()
    p.close()
    assert log.getvalue()[len(drawn):].strip(" \r") == "", "close() leaves the bar on screen"
    assert p.line() == ""


def test_a_terminal_gets_the_bar_without_being_asked() -> None:
    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as tty:
        chunks: list[bytes] = []
        reader = threading.Thread(target=_read_all, args=(leader, chunks))
        reader.start()
        p = Progress(None, tty, delay=0.0, interval=0.0)
        p.start(4)
        p.advance(3, "soak round 3")
        p.close()
    reader.join(timeout=10)
    os.close(leader)
    seen = b"".join(chunks).decode(errors="replace")
    assert p.enabled and " 75%" in seen and "soak round 3" in seen, repr(seen)


def _read_all(fd: int, into: list[bytes]) -> None:
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:  # EIO once the terminal's other end is closed
            return
        if not data:
            return
        into.append(data)


def test_short_runs_stay_silent() -> None:
    log = io.StringIO()
    p = Progress(True, log, delay=3600.0)
    p.start(10)
    p.advance(10, "done")
    p.close()
    assert log.getvalue() == ""


def test_disabled_draws_nothing_and_a_restart_replaces_the_bar() -> None:
    off = io.StringIO()
    p = Progress(False, off, delay=0.0, interval=0.0)
    p.start(2)
    p.advance(1, "x")
    p.close()
    assert off.getvalue() == ""
    log = io.StringIO()
    q = Progress(True, log, delay=0.0, interval=0.0)
    q.start(2)
    q.start(4)  # a second run closes the first bar
    q.advance(1, "second")
    q.close()
    assert " 25%|" in log.getvalue()
