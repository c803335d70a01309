"""The header decoder under fuzzing (tests/hostile_headers.py states the property): hypothesis with random bytes
and with structured mutations of valid headers, every corrupt header of the MPI test, and atheris, a
coverage-guided fuzzer, for a bounded time in a subprocess.

``CAI_MPI_FUZZ_SECONDS`` (default 10) sets how long atheris runs and scales hypothesis' examples with it:
``CAI_MPI_FUZZ_SECONDS=600 pytest tests/unit/test_header_fuzz.py`` fuzzes for ten minutes.
"""

from __future__ import annotations

import os
import platform
import re
import struct
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hostile_headers import CORRUPT, FIELDS, LIMIT, Corrupt, check_decoder, craft, seed_headers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cai_mpi._src.core.header import decode_header

pytestmark = pytest.mark.one_wheel  # (the header decoder is pure Python: the MPI library cannot change its outcome)

FUZZ_SECONDS = float(os.environ.get("CAI_MPI_FUZZ_SECONDS", "10"))
EXAMPLES = max(100, int(25 * FUZZ_SECONDS))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TESTS = Path(__file__).resolve().parents[1]
SEEDS = seed_headers()


@pytest.fixture(scope="module", autouse=True)
def _traced() -> Iterator[None]:
    """Allocation is measured while decoding (hostile_headers.check_decoder with measure=True)."""
    tracemalloc.start()
    yield
    tracemalloc.stop()


# -- known corrupt headers, one by one ------------------------------------------------------------------------------


@pytest.mark.parametrize("corrupt", CORRUPT, ids=[c.name for c in CORRUPT])
def test_a_corrupt_header_is_a_protocol_error_that_says_what_is_wrong(corrupt: Corrupt) -> None:
    outcome = check_decoder(corrupt.message, 1 << 40, measure=True)  # (the receivers' default limit)
    assert isinstance(outcome, str), f"{corrupt.name}: decoded as {outcome}"
    assert corrupt.says in outcome, outcome


@pytest.mark.parametrize("seed", SEEDS, ids=lambda b: f"{len(b)}B")
def test_every_seed_header_decodes(seed: bytes) -> None:
    assert not isinstance(check_decoder(seed, measure=True), str)


# -- hypothesis -----------------------------------------------------------------------------------------------------


@FUZZ
@given(st.binary(max_size=600))
def test_random_bytes(msg: bytes) -> None:
    check_decoder(msg, measure=True)


@FUZZ
@given(st.sampled_from(SEEDS), st.binary(max_size=400))
def test_random_bytes_after_a_valid_prefix(seed: bytes, tail: bytes) -> None:
    check_decoder(seed[:16] + tail, measure=True)


ABSURD = st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]) | st.integers(0, 99)
# Type strings and JSON that numpy's dtype() reads in surprising ways (names, lists, subarrays, huge sizes).
DTYPES = st.sampled_from([
    b"<f8", b"|u1", b"<M8[ns]", b"<M8[xx]", b"float64", b"f4,i4", b"(2,)<f4", b"(2147483647,2147483647)f8",
    b"|V0", b"|O", b"<U0", b"|S1000000000", b"<c32", b"b", b"?", b"V", b"[('a','<f4')]",
    b'{"base":"<f4","shape":[2]}', b'{"base":"<f4","shape":[-1]}', b'{"names":["a"],"formats":["<f4"],'
    b'"offsets":[0],"itemsize":4}', b'{"names":["a"],"formats":["|O"],"offsets":[0],"itemsize":8}',
    b'{"names":["a","a"],"formats":["<f4","<f4"],"offsets":[0,0],"itemsize":4}',
    b'{"names":[],"formats":[],"offsets":[],"itemsize":1000000000000}', b'"<f4"', b"[" * 5000,
])


@st.composite
def mutated_headers(draw: Any) -> bytes:
    """A valid header, then a few mutations: prefix fields set to absurd values, a new shape or dtype field with
    the lengths (and payload size) kept consistent or not, bytes flipped, the message cut or extended."""
    msg = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["field", "shape", "dtype", "flip", "cut", "extend"]))
        if kind == "field":
            name = draw(st.sampled_from(sorted(FIELDS)))
            at, fmt = FIELDS[name]
            bits = 8 * struct.calcsize(fmt)
            value = draw(ABSURD) % (1 << bits)
            if fmt == "<i":
                value -= (1 << 32) if value >= (1 << 31) else 0
            if len(msg) >= at + bits // 8:
                struct.pack_into(fmt, msg, at, value)
        elif kind in ("shape", "dtype"):
            shape = tuple(draw(st.lists(ABSURD, max_size=5))) if kind == "shape" else (3, 2)
            dfield = draw(DTYPES) if kind == "dtype" else b"<f4"
            structured = 0x02 if dfield.startswith(b"{") else 0
            payload = draw(st.sampled_from([None, *([0] if kind == "shape" else [])]) | ABSURD)
            if payload is None:  # consistent, as far as a product of the shape and the itemsize can say
                try:
                    payload = int(np.prod(shape, dtype=object)) * np.dtype(dfield.decode()).itemsize
                except Exception:
                    payload = 24
            flags = draw(st.sampled_from([0, 0x01, 0x08, 0x10])) | structured
            inline = bytes(payload) if flags & 0x01 and payload <= 4096 else b""
            msg = bytearray(craft(dfield, shape, payload % 2**64, flags=flags, tail=inline))
        elif kind == "flip" and msg:
            at = draw(st.integers(0, len(msg) - 1))
            msg[at] = draw(st.integers(0, 255))
        elif kind == "cut":
            del msg[draw(st.integers(0, len(msg))) :]
        else:
            msg += draw(st.binary(min_size=1, max_size=32))
    return bytes(msg)


@FUZZ
@given(mutated_headers())
def test_mutated_valid_headers(msg: bytes) -> None:
    check_decoder(msg, measure=True)


@FUZZ
@given(mutated_headers(), st.sampled_from([0, 1, 16, LIMIT, 2**63]))
def test_mutated_valid_headers_at_any_payload_limit(msg: bytes, limit: int) -> None:
    outcome = check_decoder(msg, limit, measure=True)  # (what decoding allocates never follows the limit)
    if not isinstance(outcome, str):
        assert outcome[0].payload_nbytes <= limit


def test_a_header_over_the_limit_is_refused_before_anything_is_allocated() -> None:
    """The payload limit is checked on the sizes a header announces, whatever they are."""
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    with pytest.raises(Exception, match="over the limit"):
        decode_header(craft(b"|u1", (1 << 40,)), len(craft(b"|u1", (1 << 40,))), max_payload_bytes=LIMIT)
    assert tracemalloc.get_traced_memory()[1] - before < 1 << 20


# -- atheris: coverage-guided, in a subprocess (libFuzzer ends the process when done) -------------------------------

ATHERIS_PLATFORM = sys.platform == "linux" and platform.machine() == "x86_64" and sys.version_info < (3, 14)


@pytest.mark.skipif(not ATHERIS_PLATFORM, reason="atheris ships wheels for x86-64 Linux, CPython 3.10-3.13 only")
def test_coverage_guided_fuzzing_with_atheris(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, msg in enumerate([*SEEDS, *(c.message for c in CORRUPT)]):
        (corpus / f"seed{i}").write_bytes(msg)
    run = subprocess.run(
        [sys.executable, str(TESTS / "fuzz_header.py"), f"-max_total_time={FUZZ_SECONDS:.0f}", "-timeout=20",
         "-rss_limit_mb=2048", "-max_len=4096", f"-dict={TESTS / 'fuzz_header.dict'}",
         f"-artifact_prefix={tmp_path}/", "-print_final_stats=1", str(corpus)],
        capture_output=True, text=True, timeout=FUZZ_SECONDS + 120, cwd=TESTS.parent,
    )
    output = run.stdout + run.stderr
    tail = "\n".join(output.splitlines()[-60:])
    assert run.returncode == 0, f"atheris found an input the decoder mishandles (crash file in {tmp_path}):\n{tail}"
    runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", output)
    assert runs and int(runs[1]) >= 1000, f"atheris hardly ran:\n{tail}"
    print(f"atheris: {runs[1]} inputs in {FUZZ_SECONDS:.0f} s")
