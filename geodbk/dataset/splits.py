"""Train / val / test split protocols for a dataset with one row per (tile, quarter).

Every protocol returns an ``(n,)`` object array of ``"train"``, ``"val"`` and ``"test"``,
deterministic for a given ``seed``.

``random``
    A random permutation of the rows, cut 8:1:1 (floor-based counts). It is the split
    that existing datasets were built with. It overstates accuracy for spatial data: a
    tile's other quarters, and its immediate neighbours, land in train, so a test row is
    predicted from almost the same place and the model is rewarded for interpolating
    over distances far shorter than it will ever be asked to.

``spatial-block``
    Square blocks of side ``block_m`` metres in a projected CRS; every row of a block
    (all quarters of all its tiles) gets the block's label. Blocks are shuffled and
    filled, in that order, into train until it holds 80% of the rows, then val until
    90%, the rest test, so the row shares stay close to 8:1:1 even when blocks hold
    very different numbers of rows. Test rows are then at least partly outside the
    training footprint, as in spatial block cross-validation (e.g. verde).

``forecast``
    Test is every row of the latest quarter; the earlier quarters' rows are split at
    random train:val = 8:1. It measures how well the past predicts the next quarter.
"""

from __future__ import annotations

import numpy as np

from geodbk.errors import InputDataError

SPLIT_PROTOCOLS = ("random", "spatial-block", "forecast")
#: Share of rows in train / val / test.
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)
#: Default side of a spatial block in metres.
DEFAULT_BLOCK_M = 10_000.0

_LABELS = np.array(["train", "val", "test"], dtype=object)


def random_split(n: int, seed: int) -> np.ndarray:
    """``(n,)`` labels from one ``default_rng(seed).permutation(n)``, cut 8:1:1.

    Train gets ``floor(0.8 n)`` rows, val ``floor(0.1 n)`` and test the rest; the
    result is the split of every geodbk dataset built before the other protocols existed.
    """
    n_train = int(np.floor(SPLIT_FRACTIONS[0] * n))
    n_val = int(np.floor(SPLIT_FRACTIONS[1] * n))
    labels = np.empty(n, dtype=object)
    order = np.random.default_rng(seed).permutation(n)
    labels[order[:n_train]] = "train"
    labels[order[n_train : n_train + n_val]] = "val"
    labels[order[n_train + n_val :]] = "test"
    return labels


def block_ids(xy_m: np.ndarray, block_m: float = DEFAULT_BLOCK_M) -> np.ndarray:
    """``(n,)`` int64 block index in ``[0, n_blocks)`` of ``(n, 2)`` points in metres.

    A block is the square ``floor(xy_m / block_m)``; indices follow the sorted block
    coordinates, so they do not depend on the order of the rows.
    """
    xy = np.asarray(xy_m, dtype=np.float64)
    if xy.ndim != 2 or xy.shape[1] != 2:
        raise InputDataError(f"xy_m must have shape (n, 2), got {xy.shape}")
    if not np.all(np.isfinite(xy)):
        raise InputDataError("xy_m has NaN or infinite coordinates")
    if not (np.isfinite(block_m) and block_m > 0):
        raise InputDataError(f"block_m must be a positive number of metres, got {block_m}")
    cells = np.floor(xy / block_m).astype(np.int64)
    _, ids = np.unique(cells, axis=0, return_inverse=True)
    return ids.reshape(-1)


def _block_cuts(sizes: np.ndarray) -> tuple[int, int]:
    """Cut ``(n_blocks,)`` row counts, in shuffled order, into train / val / test.

    Returns ``(a, b)``: blocks ``[0, a)`` are train, ``[a, b)`` val, ``[b, n_blocks)``
    test. A block goes to train while the rows before it are under 80% of the total,
    to val while under 90%. An empty val takes the next block; an empty test takes the
    last block; train always keeps at least the first. Needs ``n_blocks >= 3``.
    """
    n_blocks = len(sizes)
    before = np.cumsum(sizes) - sizes
    total = float(before[-1] + sizes[-1])
    a = int(np.searchsorted(before, SPLIT_FRACTIONS[0] * total, side="left"))
    b = int(np.searchsorted(before, (SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1]) * total, side="left"))
    a = min(a, n_blocks - 2)
    b = min(max(b, a + 1), n_blocks - 1)
    return a, b


def spatial_block_split(xy_m: np.ndarray, seed: int, block_m: float = DEFAULT_BLOCK_M) -> np.ndarray:
    """``(n,)`` labels, one per square block of side ``block_m`` metres.

    ``xy_m`` is ``(n, 2)`` in metres of a projected CRS. Blocks are shuffled with
    ``default_rng(seed)`` and filled in that order by row count to 80% train, 10% val
    and the rest test (see :func:`_block_cuts`); each split gets at least one block.
    """
    ids = block_ids(xy_m, block_m)
    n_blocks = int(ids.max()) + 1 if ids.size else 0
    if n_blocks < 3:
        raise InputDataError(
            f"spatial-block split needs 3 blocks but the points fall in only {n_blocks} "
            f"blocks of {block_m / 1000:g} km; use a smaller block_m or the random split"
        )
    order = np.random.default_rng(seed).permutation(n_blocks)
    a, b = _block_cuts(np.bincount(ids, minlength=n_blocks)[order])
    code = np.empty(n_blocks, dtype=np.int64)
    code[order[:a]] = 0
    code[order[a:b]] = 1
    code[order[b:]] = 2
    return _LABELS[code[ids]]


def forecast_split(period: np.ndarray, seed: int) -> np.ndarray:
    """``(n,)`` labels: test is the latest period, earlier rows split train:val = 8:1.

    ``period`` is an ``(n,)`` integer quarter index, e.g. ``year * 4 + quarter - 1``.
    Val gets ``round(m / 9)`` of the ``m`` earlier rows, drawn by
    ``default_rng(seed).permutation(m)``.
    """
    p = np.asarray(period)
    if p.ndim != 1:
        raise InputDataError(f"period must have shape (n,), got {p.shape}")
    integral = np.issubdtype(p.dtype, np.integer) or (
        np.issubdtype(p.dtype, np.floating) and bool(np.all(p == np.round(p)))
    )
    if not integral:
        raise InputDataError("period must hold integer quarter indices (no NaN)")
    n_periods = len(np.unique(p))
    if n_periods < 2:
        raise InputDataError(f"forecast split needs 2 distinct periods but the rows have {n_periods}")
    latest = p == p.max()
    earlier = np.flatnonzero(~latest)
    val_share = SPLIT_FRACTIONS[1] / (SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1])
    n_val = int(round(val_share * len(earlier)))
    labels = np.full(len(p), "train", dtype=object)
    labels[latest] = "test"
    labels[earlier[np.random.default_rng(seed).permutation(len(earlier))[:n_val]]] = "val"
    return labels


def _common_length(n: int | None, xy_m: np.ndarray | None, period: np.ndarray | None) -> int | None:
    """The one row count that ``n``, ``len(xy_m)`` and ``len(period)`` agree on, if any is given."""
    lengths = {
        name: length
        for name, length in (
            ("n", n),
            ("xy_m", None if xy_m is None else len(xy_m)),
            ("period", None if period is None else len(period)),
        )
        if length is not None
    }
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{name}={length}" for name, length in lengths.items())
        raise InputDataError(f"split inputs disagree on the number of rows: {shown}")
    return next(iter(lengths.values()), None)


def assign_split(
    protocol: str,
    *,
    n: int | None = None,
    xy_m: np.ndarray | None = None,
    period: np.ndarray | None = None,
    seed: int = 0,
    block_m: float = DEFAULT_BLOCK_M,
) -> np.ndarray:
    """``(n,)`` labels by ``protocol``, one of :data:`SPLIT_PROTOCOLS`.

    ``random`` needs the row count (``n``, or either array); ``spatial-block`` needs
    ``xy_m`` ``(n, 2)`` in metres; ``forecast`` needs ``period`` ``(n,)``. Whatever is
    given must agree on the number of rows.
    """
    if protocol not in SPLIT_PROTOCOLS:
        raise InputDataError(f"unknown split protocol {protocol!r}; choose one of {', '.join(SPLIT_PROTOCOLS)}")
    length = _common_length(n, xy_m, period)
    if protocol == "random":
        if length is None:
            raise InputDataError("the random split needs n (or xy_m or period) to know the number of rows")
        return random_split(length, seed)
    if protocol == "spatial-block":
        if xy_m is None:
            raise InputDataError("the spatial-block split needs xy_m, the (n, 2) coordinates in metres")
        return spatial_block_split(xy_m, seed, block_m)
    if period is None:
        raise InputDataError("the forecast split needs period, the (n,) integer quarter index")
    return forecast_split(period, seed)
