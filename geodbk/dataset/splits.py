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
    training footprint, as in spatial block cross-validation (e.g. verde). Without a
    ``block_m`` the side is chosen from the data (:func:`choose_block_m`): the largest of
    :data:`BLOCK_LADDER_M` that holds out enough blocks and rows for that seed, so that a
    city gets smaller squares than an island chain.

``forecast``
    Test is every row of the latest quarter; the earlier quarters' rows are split at
    random train:val = 8:1. It measures how well the past predicts the next quarter.

:func:`check_usable_split` refuses a split whose validation or test set is too small to choose
or score a model (fewer than :data:`MIN_HELD_OUT_ROWS` rows or :data:`MIN_HELD_OUT_BLOCKS`
blocks); the ``geodbk`` verbs that make or use a split call it, the Python API does not.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from geodbk.errors import InputDataError
from geodbk.quarters import Quarter

SPLIT_PROTOCOLS = ("random", "spatial-block", "forecast")
#: The labels every protocol gives the rows.
SPLITS = ("train", "val", "test")
#: Share of rows in train / val / test.
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)
#: Sides of a spatial block that :func:`choose_block_m` tries, metres, largest first.
BLOCK_LADDER_M = (10_000.0, 8_000.0, 6_000.0, 5_000.0, 4_000.0, 3_000.0, 2_500.0, 2_000.0, 1_500.0, 1_200.0, 1_000.0)
#: Side of a spatial block in metres where none is given or chosen (datasets written before the choice).
DEFAULT_BLOCK_M = BLOCK_LADDER_M[0]
#: What a chosen side aims for: at least this many blocks in each of val and test ...
GOAL_HELD_OUT_BLOCKS = 8
#: ... and at least this share of the rows in each.
GOAL_HELD_OUT_SHARE = 0.05
#: A split with fewer rows in val or test is refused by :func:`check_usable_split`.
MIN_HELD_OUT_ROWS = 100
#: A spatial-block split with fewer blocks in val or test is refused by :func:`check_usable_split`.
MIN_HELD_OUT_BLOCKS = 5
#: Test sets with fewer blocks (spatial-block) or rows than these give noisy metrics (:func:`noisy_test_note`).
NOISY_TEST_BLOCKS = 20
NOISY_TEST_ROWS = 1_000
#: Validation sets with fewer rows than this get :func:`few_validation_rows_note`: on Vieques with
#: Culebra (104 rows) what they chose fitted them and not the test rows (docs/small-regions.md).
FEW_VALIDATION_ROWS = 300

_LABELS = np.array(SPLITS, dtype=object)
#: The held-out splits as the messages name them.
_HELD_OUT = {"val": "validation", "test": "test"}


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


def _block_codes(ids: np.ndarray, seed: int) -> np.ndarray:
    """``(n_blocks,)`` split code (0 train, 1 val, 2 test) of each block of ``ids`` ``(n,)``.

    Blocks are shuffled with ``default_rng(seed)`` and cut by row count (:func:`_block_cuts`);
    needs at least 3 blocks.
    """
    n_blocks = int(ids.max()) + 1
    order = np.random.default_rng(seed).permutation(n_blocks)
    a, b = _block_cuts(np.bincount(ids, minlength=n_blocks)[order])
    code = np.empty(n_blocks, dtype=np.int64)
    code[order[:a]] = 0
    code[order[a:b]] = 1
    code[order[b:]] = 2
    return code


def split_shares(protocol: str) -> str:
    """The protocol's shares as a ratio from :data:`SPLIT_FRACTIONS`: ``"8:1:1"`` (train:val:test) for
    ``random`` and ``spatial-block``; ``"8:1"`` (train:val of the rows before the last quarter, which
    is the test set) for ``forecast``."""
    parts = SPLIT_FRACTIONS[:2] if protocol == "forecast" else SPLIT_FRACTIONS
    return ":".join(f"{part / min(parts):g}" for part in parts)


def _holds_out_enough(blocks: int, rows: int) -> bool:
    """Whether a spatial-block split's held-out set of ``blocks`` blocks and ``rows`` rows can choose
    or score a model: :data:`MIN_HELD_OUT_BLOCKS` blocks and :data:`MIN_HELD_OUT_ROWS` rows. The one
    rule of :func:`check_usable_split` and of the sides :func:`choose_block_m` prefers."""
    return blocks >= MIN_HELD_OUT_BLOCKS and rows >= MIN_HELD_OUT_ROWS


def choose_block_m(xy_m: np.ndarray, seed: int) -> float:
    """The spatial-block side, metres, for ``(n, 2)`` points ``xy_m`` in metres split with ``seed``.

    In order of preference, over :data:`BLOCK_LADDER_M` (each the largest such side):

    1. a side whose split (:func:`spatial_block_split` with this ``seed``) reaches the goal, val
       and test at least :data:`GOAL_HELD_OUT_BLOCKS` blocks and :data:`GOAL_HELD_OUT_SHARE` of
       the rows each, and is usable (:func:`check_usable_split`: :data:`MIN_HELD_OUT_BLOCKS`
       blocks and :data:`MIN_HELD_OUT_ROWS` rows each);
    2. a usable side (fewer than 8 blocks somewhere: its metrics are noisy, and
       :func:`check_usable_split` warns). Below 2,000 rows, 5% of them is under 100 rows, so a side
       can reach the goal with too few rows to score on: 1,044 rows of Vieques and Culebra took
       1.2 km squares with 72 test rows at seed 0, which every verb refused, while 1.5 km squares
       held out 6 test blocks of 100 rows or more;
    3. a side that reaches the goal;
    4. the side with the most blocks in the smaller of val and test (the larger side on ties).

    :func:`check_usable_split` refuses the last two.
    """
    xy = np.asarray(xy_m, dtype=np.float64)
    usable_m: float | None = None
    goal_m: float | None = None
    best_m, best_blocks = BLOCK_LADDER_M[0], -1
    for side in BLOCK_LADDER_M:
        ids = block_ids(xy, side)
        if ids.size == 0 or ids.max() < 2:  # fewer than 3 blocks: no split at this side
            held_blocks = 0
        else:
            code = _block_codes(ids, seed)
            held_blocks = min(int(np.sum(code == 1)), int(np.sum(code == 2)))
            held_rows = int(min(np.bincount(code[ids], minlength=3)[1:]))
            usable = _holds_out_enough(held_blocks, held_rows)
            goal = held_blocks >= GOAL_HELD_OUT_BLOCKS and held_rows >= GOAL_HELD_OUT_SHARE * len(ids)
            if usable and goal:
                return side
            if usable and usable_m is None:
                usable_m = side
            if goal and goal_m is None:
                goal_m = side
        if held_blocks > best_blocks:
            best_m, best_blocks = side, held_blocks
    for chosen in (usable_m, goal_m):
        if chosen is not None:
            return chosen
    return best_m


def spatial_block_split(xy_m: np.ndarray, seed: int, block_m: float | None = DEFAULT_BLOCK_M) -> np.ndarray:
    """``(n,)`` labels, one per square block of side ``block_m`` metres.

    ``xy_m`` is ``(n, 2)`` in metres of a projected CRS. Blocks are shuffled with
    ``default_rng(seed)`` and filled in that order by row count to 80% train, 10% val
    and the rest test (see :func:`_block_cuts`); each split gets at least one block.
    ``block_m=None`` chooses the side (:func:`choose_block_m`).
    """
    block_m = choose_block_m(xy_m, seed) if block_m is None else block_m
    ids = block_ids(xy_m, block_m)
    n_blocks = int(ids.max()) + 1 if ids.size else 0
    if n_blocks < 3:
        raise InputDataError(
            f"the spatial-block split needs 3 blocks but the points fall in only {n_blocks} "
            f"block{'' if n_blocks == 1 else 's'} of {block_m / 1000:g} km; use smaller blocks (block_m, "
            "--block-km) or the random split"
        )
    return _LABELS[_block_codes(ids, seed)[ids]]


def fitted_quarters(quarters: Sequence[Quarter], protocol: str) -> tuple[Quarter, ...]:
    """The quarters that hold training rows when rows of ``quarters`` (oldest first) are split by
    ``protocol``: all but the last under ``forecast`` (:func:`forecast_split` tests on it), else all.
    """
    held_out = protocol == "forecast" and len(quarters) > 1
    return tuple(quarters[:-1] if held_out else quarters)


def forecast_split(period: np.ndarray, seed: int) -> np.ndarray:
    """``(n,)`` labels: test is the latest period, earlier rows split train:val = 8:1.

    ``period`` is an ``(n,)`` integer quarter index, e.g. :meth:`geodbk.quarters.Quarter.index_of`.
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
        raise InputDataError(f"the forecast split needs 2 distinct quarters but the rows have {n_periods}; use more "
                             "quarters or another --split")
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
    block_m: float | None = None,
) -> np.ndarray:
    """``(n,)`` labels by ``protocol``, one of :data:`SPLIT_PROTOCOLS`.

    ``random`` needs the row count (``n``, or either array); ``spatial-block`` needs
    ``xy_m`` ``(n, 2)`` in metres and takes blocks of ``block_m`` metres (``None``: chosen by
    :func:`choose_block_m`); ``forecast`` needs ``period`` ``(n,)``. Whatever is given must
    agree on the number of rows.
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


def blocks_per_split(labels: np.ndarray, ids: np.ndarray) -> dict[str, int]:
    """Distinct blocks of each split: ``{"train": .., "val": .., "test": ..}`` from ``(n,)`` labels
    and ``(n,)`` block ids (:func:`block_ids`)."""
    labels, ids = np.asarray(labels).astype(str), np.asarray(ids)
    return {str(split): len(np.unique(ids[labels == split])) for split in _LABELS}


def _count(count: int, split: str, what: str) -> str:
    """``"1 validation block"``, ``"60 test rows"``: ``count`` of ``what`` in a held-out ``split``."""
    return f"{count:,} {_HELD_OUT[split]} {what}{'' if count == 1 else 's'}"


def check_usable_split(
    labels: np.ndarray,
    protocol: str,
    *,
    blocks: Mapping[str, int] | None = None,
    block_m: float | None = None,
    chosen: bool = False,
) -> None:
    """Refuse a split too small to choose or score a model; warn where a chosen side falls short.

    ``labels`` ``(n,)`` are ``"train"``/``"val"``/``"test"`` by ``protocol``; a ``spatial-block``
    split also needs ``blocks`` (blocks per split, :func:`blocks_per_split`) and their side
    ``block_m`` in metres. ``chosen``: the side was chosen by :func:`choose_block_m`, not given.

    Raises:
        InputDataError: val or test has fewer than :data:`MIN_HELD_OUT_ROWS` rows, or (spatial-block)
            fewer than :data:`MIN_HELD_OUT_BLOCKS` blocks; the one-line message says what to pass.

    Warns:
        UserWarning: a chosen side leaves val or test fewer than :data:`GOAL_HELD_OUT_BLOCKS` blocks.
    """
    labels = np.asarray(labels).astype(str)
    n = len(labels)
    rows = {split: int(np.sum(labels == split)) for split in _HELD_OUT}
    if protocol == "spatial-block":
        if blocks is None or block_m is None:
            raise InputDataError("checking a spatial-block split needs its blocks per split and block_m")
        short = [s for s in _HELD_OUT if not _holds_out_enough(blocks[s], rows[s])]
        found = (" and ".join(f"{_count(blocks[s], s, 'block')} ({rows[s]:,} rows)" for s in short)
                 + f" at {block_m / 1000:g} km squares (at least {MIN_HELD_OUT_BLOCKS} blocks and "
                 f"{MIN_HELD_OUT_ROWS} rows needed)")
        noisy = " and ".join(
            _count(blocks[s], s, "block") for s in _HELD_OUT if chosen and blocks[s] < GOAL_HELD_OUT_BLOCKS)
        few_blocks = any(blocks[s] < MIN_HELD_OUT_BLOCKS for s in short)
    else:
        short = [s for s in _HELD_OUT if rows[s] < MIN_HELD_OUT_ROWS]
        found = " and ".join(_count(rows[s], s, "row") for s in short) + (
            f" (at least {MIN_HELD_OUT_ROWS} needed)")
        noisy, few_blocks = "", False
    if short:
        if SPLIT_FRACTIONS[1] * n < MIN_HELD_OUT_ROWS:  # no protocol can hold out enough rows
            advice = "use more tiles or quarters"
        elif protocol == "spatial-block" and chosen:  # choose_block_m found no usable side
            advice = (f"no square from {BLOCK_LADDER_M[0] / 1000:g} km down to {BLOCK_LADDER_M[-1] / 1000:g} km "
                      "holds out enough; use more tiles or quarters, another --seed, or --split random")
        elif protocol == "spatial-block" and few_blocks:
            advice = "pass a smaller --block-km, or --split random"
        elif protocol == "spatial-block":
            advice = "pass another --block-km (or none, and geodbk chooses one), or --split random"
        else:
            advice = "use more tiles or quarters, or --split random"
        raise InputDataError(f"the {protocol} split of {n:,} rows leaves {found}; {advice}")
    if noisy:
        warnings.warn(f"only {noisy}: metrics from this split are noisy", UserWarning, stacklevel=2)


def few_validation_rows_note(val_rows: int) -> str | None:
    """One line saying that a fit's validation-chosen parts rest on few rows, when the validation
    set has fewer than :data:`FEW_VALIDATION_ROWS`; None otherwise."""
    if val_rows >= FEW_VALIDATION_ROWS:
        return None
    return (f"note: only {val_rows:,} validation rows chose a GP fit's early stop, its residual field's kernel and "
            "the new-measurement family; choices made on so few may not carry to new data (compare several "
            "--seed values)")


def noisy_test_note(test_rows: int, test_blocks: int | None = None) -> str | None:
    """One line saying that test metrics are noisy, when the test set has fewer than
    :data:`NOISY_TEST_ROWS` rows or ``test_blocks`` (spatial-block) fewer than
    :data:`NOISY_TEST_BLOCKS` blocks; None otherwise."""
    few_blocks = test_blocks is not None and test_blocks < NOISY_TEST_BLOCKS
    if not (few_blocks or test_rows < NOISY_TEST_ROWS):
        return None
    source = f"{test_rows:,} rows" if test_blocks is None else f"{test_blocks} blocks ({test_rows:,} rows)"
    return (f"note: the test metrics come from only {source}, so they are noisy; compare models over several "
            "--seed values")
