"""The one loop over blocks of rows: :func:`blocks`.

Work on many points (kriging solves, tree queries, factor lookups, validation batches, grid
rows, posterior correlations) runs a block of rows at a time, so that its temporaries stay
bounded. Every such loop takes its slices from here. It sits on the ground floor, beside
:mod:`geodbk.quarters`, so that every layer can use it without importing torch (the model
package does).
"""

from __future__ import annotations

from collections.abc import Iterator


def blocks(stop: int, size: int, start: int = 0) -> Iterator[slice]:
    """Consecutive slices ``slice(first, min(first + size, stop))`` of at most ``size`` rows
    covering the row numbers ``range(start, stop)`` in order; none when ``stop <= start``.

    Both ends of every slice are explicit, so ``np.arange(rows.start, rows.stop)`` gives a
    block's row numbers.
    """
    if size < 1:
        raise ValueError(f"a block needs at least one row, got size {size}")
    for first in range(start, stop, size):
        yield slice(first, min(first + size, stop))
