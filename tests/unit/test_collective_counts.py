"""When gather_array and allgather_array may use MPI's C-int counts (``Gatherv``/``Allgatherv``) and when they must
take the large-count path: every piece and the whole receive buffer, each piece rounded up to 64 bytes as it is
laid out, fit ``INT_MAX``. A wrong answer loses data only past 2 GiB, which no test transfers (a survivor of the
mutation run, docs/testing.md); the rule itself is checked here at its boundaries."""

from __future__ import annotations

import pytest

from cai_mpi._src.api.gathers import _small
from cai_mpi._src.transport.bigcount import INT_MAX

LAST_FIT = INT_MAX - INT_MAX % 64  # the largest multiple of 64 that fits


@pytest.mark.parametrize(("sizes", "small"), [
    ([0], True),
    ([1, 2, 3], True),
    ([LAST_FIT], True),
    ([LAST_FIT + 1], False),  # rounds up to 2**31
    ([INT_MAX], False),
    ([LAST_FIT - 64, 64], True),  # the total exactly at the last fit
    ([LAST_FIT - 64, 65], False),  # 65 bytes take 128
    ([2**30, 2**30], False),  # each piece fits, the total does not
    ([INT_MAX + 1, 0], False),
], ids=["empty", "tiny", "last-fit", "rounds-over", "int-max", "total-fits", "total-rounds-over", "total-over",
        "piece-over"])
def test_small_counts_only_when_every_piece_and_the_total_fit_a_c_int(sizes: list[int], small: bool) -> None:
    assert _small(sizes, []) is small
