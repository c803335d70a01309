"""Packing a strided device array moves its bytes as the widest unsigned word every stepped stride, every pointer
and the itemsize allow (``runtime.cudapack.byte_view``): narrower words give the same bytes, but a wide load that
is misaligned faults, and bytes one at a time cost a kernel eight loads where one would do."""

from __future__ import annotations

import numpy as np
import pytest

from cai_mpi._src.runtime.cudapack import byte_view


@pytest.mark.parametrize("itemsize, strides, pointer, word", [
    (8, (16,), 0, 8),  # float64, every other element: u8 words
    (8, (16,), 4, 4),  # a pointer aligned to 4 only
    (4, (12,), 0, 4),  # float32, every third element
    (8, (12,), 0, 4),  # a stride of 12: 4-byte words, two per item
    (2, (6,), 0, 2),
    (3, (3,), 0, 1),  # an odd itemsize: bytes
])
def test_the_widest_word_that_divides_itemsize_strides_and_pointers(itemsize: int, strides: tuple[int, ...],
                                                                    pointer: int, word: int) -> None:
    dtype, shape, byte_strides = byte_view((5,), strides, itemsize, [pointer])
    assert dtype == np.dtype(f"u{word}")
    if word == itemsize:
        assert (shape, byte_strides) == ((5,), strides)
    else:  # (an item wider than the word: a trailing axis of words)
        assert (shape, byte_strides) == ((5, itemsize // word), (*strides, word))
