"""A Pipeline's failure notice, encoded and read back on one process: what a failing stage sends every other."""

from __future__ import annotations

from cai_mpi._src.api.pipeline_wire import encode_notice, failure_from


def test_a_notice_of_a_long_non_ascii_message_is_cut_to_64_kib() -> None:
    """JSON escapes each non-ASCII character as six bytes, so 16 Ki of them (the most a notice keeps of a message)
    are 96 KiB: the message is halved until the notice fits the 64 KiB every other stage posts to receive it."""
    message = "é" * (16 << 10)
    raw = encode_notice(2, {"item": 7}, ValueError(message), own=False)
    assert len(raw) <= 64 << 10
    error = failure_from(raw)
    assert error.error_type == "ValueError" and error.meta is None  # the meta is dropped first
    assert 0 < len(error.error_message) < len(message) and message.startswith(error.error_message)


def test_a_short_notice_keeps_everything() -> None:
    raw = encode_notice(1, {"item": 7}, KeyError("k"), own=False)
    error = failure_from(raw)
    assert (error.error_type, error.meta, error.error_message) == ("KeyError", {"item": 7}, "'k'")


def test_a_long_ascii_message_keeps_its_first_16_ki_characters_and_the_meta() -> None:
    """What fits is kept as it is: the first 16 Ki characters of a message (all of one that long), the last 16 Ki of
    a traceback, and the meta, since ASCII text that long still fits the 64 KiB notice."""
    for length in (16 << 10, (16 << 10) + 1, 20_000):
        message = "".join(chr(ord("a") + i % 26) for i in range(length))
        try:
            raise ValueError(message + "|")
        except ValueError as exc:  # (raised: a traceback of its own, longer than 16 Ki with the message in it)
            raw = encode_notice(3, {"item": 7}, exc, own=True)
        error = failure_from(raw)
        kept = (message + "|")[: 16 << 10]
        assert (error.error_type, error.meta, error.error_message) == ("ValueError", {"item": 7}, kept)
        assert len(error.error_traceback) == 16 << 10 and error.error_traceback.endswith("|\n")
