"""A fitted model's speed over H3 hexagons, the cells of the FCC's mobile coverage maps.

:func:`summarize_hexagons` covers the model's fitted region with the hexagons of one H3
resolution whose centres lie inside it (:class:`~geodbk.maps.hexagons.HexagonCover`; the 5G
Fund map uses resolution 9) and gives one row per hexagon, at one quarter:

=========================  =============================================================
``h3``                     the hexagon's H3 id (hexadecimal string, as the FCC publishes it)
``quarter``                the quarter, e.g. ``"2023Q4"``
``mean_log10_<t>``         the hexagon mean of target ``t``'s tile-mean log10 speed (Mbps)
                           over its tiles (see below)
``sd_log10_<t>``           its sd under the joint posterior of the tiles (not their mean sd)
``median_<t>_<u>``         ``10 ** mean_log10_<t>``: the hexagon's geometric-mean value in the
                           model's units ``u`` (``mbps``; ``ms`` for latency)
``correlation``            (two targets) the correlation of the two hexagon means (the
                           model's tile correlation, which its posterior gives every site)
``p_meets``                P(hexagon mean download >= D and upload >= U) for two targets;
                           P(hexagon mean >= its level) for one
``share_meets``            expected share of the hexagon that meets the benchmark: the
                           weighted mean of its tiles' own P(meets)
``benchmark``              the benchmark, ``"D/U"`` Mbps (``"35/3"``)
``observed_tiles``         the model's distinct training tiles whose centre is in the
                           hexagon (-1 each for a model saved without them)
``geometry``               the hexagon, EPSG:4326
=========================  =============================================================

A model of a target without a speed benchmark (latency) gets no benchmark columns.

A hexagon's mean is over the zoom-16 tiles its sample points fall in, each weighted by its share
of them (:meth:`~geodbk.maps.hexagons.HexagonCover.tile_points`): the model's tile-mean speed is
one value per tile, and at resolution 9 that is a quarter of the points. Hexagons are summarised
in blocks of whole hexagons of about ``points_per_block`` (hexagon, tile) points, so memory
follows the block: the posterior of each block's hexagon means is asked for with
``covariance=False`` (each mean's own joint variance over its tiles; no covariance between
hexagons), and the block's distinct tiles' own marginals for ``share_meets``. The model does not
store test counts per tile, so there is no count of observed tests.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import geopandas as gpd
import numpy as np
from tqdm.auto import tqdm

from geodbk.errors import ExtrapolationWarning, InputDataError
from geodbk.maps.hexagons import TILE_RESOLUTION, HexagonCover
from geodbk.maps.thresholds import Benchmark, default_benchmark
from geodbk.quarters import Quarter

#: (hexagon, tile) points whose posterior is asked for together (whole hexagons; at least one).
POINTS_PER_BLOCK = 50_000
PROGRESS_LABEL = "summarising hexagons"


def benchmark_levels(targets: tuple[str, ...], benchmark: Benchmark) -> tuple[float, ...] | None:
    """The log10 level of ``benchmark`` for each target, (T,), or ``None`` when a target (latency)
    has none."""
    levels = dict(zip(("download", "upload"), benchmark.log10_levels, strict=True))
    if not all(target in levels for target in targets):
        return None
    return tuple(levels[target] for target in targets)


def summarize_hexagons(
    model: Any,
    resolution: int = TILE_RESOLUTION,
    quarter: Quarter | str | None = None,
    benchmark: Benchmark | str | None = None,
    *,
    points_per_block: int = POINTS_PER_BLOCK,
    progress: bool = True,
) -> gpd.GeoDataFrame:
    """Summarise a fitted :class:`~geodbk.fit.geomodel.GeoModel` (a GP kind) over the H3 hexagons
    of its fitted region.

    Args:
        model: the fitted model (one target, or download and upload).
        resolution: H3 resolution, 5 to 10 (9: about 0.1 km^2, the FCC's mobile map cells).
        quarter: a :class:`~geodbk.quarters.Quarter` or its label ``"2023Q4"`` (default the
            model's latest fitted quarter).
        benchmark: ``Benchmark`` or ``"D/U"`` Mbps (default the FCC pair of the model's service:
            35/3 mobile, 100/20 fixed).
        points_per_block: (hexagon, tile) points predicted together (whole hexagons).
        progress: show a tqdm bar over hexagons.

    Returns:
        One row per hexagon with the columns of the module docstring, EPSG:4326.

    Raises:
        InputDataError: for a model without a joint posterior, a bad resolution or benchmark.
    """
    if not model.has_kernel:
        raise InputDataError(f"hexagon summaries need a GP model; {model.kind} has no joint posterior")
    if points_per_block < 1:
        raise InputDataError(f"points_per_block must be >= 1, got {points_per_block}")
    benchmark = default_benchmark(model.info.service) if benchmark is None else Benchmark.parse(benchmark)
    quarter = model.latest_quarter if quarter is None else Quarter.parse(quarter)
    targets = tuple(model.targets)
    levels = benchmark_levels(targets, benchmark)
    cover = HexagonCover.over(model.fitted_region().geometry, resolution)
    lonlat, hexagon, weights = cover.tile_points()
    n, n_targets = len(cover), len(targets)
    mean, sd = np.full((n, n_targets), np.nan), np.full((n, n_targets), np.nan)
    correlation, p_meets, share = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    extrapolation: str | None = None
    with tqdm(total=n, desc=PROGRESS_LABEL, unit="hexagon", disable=not progress) as bar:
        for rows, points in _blocks(hexagon, n, points_per_block):
            count = rows.stop - rows.start
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ExtrapolationWarning)
                means = model.posterior(lonlat[points], quarter, groups=hexagon[points] - rows.start, n_groups=count,
                                        weights=weights[points], covariance=False)
                mean[rows], sd[rows] = means.mean, means.sd()
                if n_targets == 2:
                    correlation[rows] = means.correlation()
                if levels is not None:
                    p_meets[rows] = means.probability_meets(levels)
                    tiles, tile = np.unique(lonlat[points], axis=0, return_inverse=True)
                    meets = model.posterior(tiles, quarter, covariance=False).probability_meets(levels)
                    share[rows] = np.bincount(hexagon[points] - rows.start, minlength=count,
                                              weights=weights[points] * meets[tile.reshape(-1)])
            for w in caught:  # one extrapolation warning for the whole summary, the others as raised
                if issubclass(w.category, ExtrapolationWarning):
                    extrapolation = extrapolation or str(w.message)
                else:
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            bar.update(count)
    if extrapolation is not None:
        warnings.warn(extrapolation, ExtrapolationWarning, stacklevel=2)
    key = model.info.units.lower()
    columns: dict[str, Any] = {"h3": cover.ids, "quarter": str(quarter)}
    for k, target in enumerate(targets):
        columns[f"mean_log10_{target}"], columns[f"sd_log10_{target}"] = mean[:, k], sd[:, k]
        columns[f"median_{target}_{key}"] = 10.0 ** mean[:, k]
    if n_targets == 2:
        columns["correlation"] = correlation
    if levels is not None:
        columns["p_meets"], columns["share_meets"], columns["benchmark"] = p_meets, share, str(benchmark)
    columns["observed_tiles"] = _observed_tiles(model, cover)
    return gpd.GeoDataFrame(columns, geometry=cover.polygons(), crs=4326)


def _blocks(hexagon: np.ndarray, n: int, points_per_block: int) -> Iterator[tuple[slice, slice]]:
    """Blocks of whole hexagons, ``(hexagon positions, their points)``, of at most
    ``points_per_block`` points each (a hexagon with more alone); ``hexagon`` (m,) ascending
    positions in [0, n) of each point."""
    starts = np.searchsorted(hexagon, np.arange(n + 1))  # each hexagon's first point, then m
    first = 0
    while first < n:
        last = max(first + 1, int(np.searchsorted(starts, starts[first] + points_per_block, side="right")) - 1)
        last = min(last, n)
        yield slice(first, last), slice(int(starts[first]), int(starts[last]))
        first = last


def _observed_tiles(model: Any, cover: HexagonCover) -> np.ndarray:
    """(n,) distinct training tiles of ``model`` whose centre is in each hexagon of ``cover``;
    -1 each for a model without tile locations."""
    if model.support is None:
        return np.full(len(cover), -1, dtype=np.int64)
    hexagon = cover.index_of(model.support)
    return np.bincount(hexagon[hexagon >= 0], minlength=len(cover))


__all__ = ["POINTS_PER_BLOCK", "benchmark_levels", "summarize_hexagons"]
