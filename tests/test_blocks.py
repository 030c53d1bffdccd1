"""The one loop over blocks of rows (geodbk.blocks)."""

from __future__ import annotations

import numpy as np
import pytest

from geodbk.blocks import blocks


@pytest.mark.parametrize(("stop", "size", "start"), [(10, 4, 0), (8, 4, 0), (3, 4, 0), (1, 1, 0), (11, 3, 5)])
def test_blocks_cover_the_rows_once_in_order_with_explicit_ends(stop, size, start):
    slices = list(blocks(stop, size, start=start))
    rows = np.concatenate([np.arange(s.start, s.stop) for s in slices])
    np.testing.assert_array_equal(rows, np.arange(start, stop))
    assert all(0 < s.stop - s.start <= size for s in slices)
    assert all(s.stop - s.start == size for s in slices[:-1])  # only the last block is short


def test_no_rows_no_blocks_and_a_block_needs_a_row():
    assert list(blocks(0, 5)) == [] and list(blocks(4, 5, start=4)) == []
    with pytest.raises(ValueError, match="at least one row"):
        list(blocks(10, 0))
