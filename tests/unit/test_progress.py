"""The progress bar of bench and soak: drawn on a terminal (or when asked), never into a pipe or a log; by tqdm
when the bench extra is installed, else as a plain text line of the same shape (every test runs both ways)."""

from __future__ import annotations

import io
import os
import threading

import pytest

from cai_mpi._src.cli.bench import progress
from cai_mpi._src.cli.bench.progress import Progress


@pytest.fixture(autouse=True, params=["tqdm", "plain"])
def drawn_by(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test of this file with tqdm drawing, then as where tqdm is not installed (no bench extra)."""
    if request.param == "tqdm":
        pytest.importorskip("tqdm", reason="tqdm comes with the bench extra (scripts/test.sh installs it)")
    else:
        monkeypatch.setattr(progress, "tqdm", None)
    return str(request.param)


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


def test_without_tqdm_the_line_is_plain_text(drawn_by: str) -> None:
    log = io.StringIO()
    p = Progress(True, log, delay=0.0, interval=0.0, width=10)
    p.start(4)
    p.advance(1, "bw 8 B cai")
    assert p.line().startswith(" 25%|##        | bw 8 B cai [00:00<") or drawn_by == "tqdm", p.line()
    p.advance(3, "a")  # a shorter label: the longer line before it is overwritten, not left behind
    drawn = log.getvalue()
    last = drawn.rsplit("\r", 1)[-1]
    assert last.startswith("100%|") and len(last) >= len(drawn.split("\r")[1]), repr(drawn)
    p.close()
    assert log.getvalue()[len(drawn):].strip(" \r") == ""
