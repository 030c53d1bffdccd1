"""Where to test next, on H3 hexagons: a fitted model's posterior over its region's hexagons,
then the greedy, batch-aware plan of :func:`~geodbk.decisions.plan.plan_visits`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import geopandas as gpd
import numpy as np

from geodbk.decisions.plan import plan_visits
from geodbk.errors import InputDataError
from geodbk.maps.hexagons import HexagonCover
from geodbk.maps.thresholds import Benchmark, default_benchmark

if TYPE_CHECKING:  # pragma: no cover - typing only
    from geodbk.fit.geomodel import GeoModel

def decision_levels(model: GeoModel, benchmark: str | Benchmark | None = None) -> tuple[float, ...]:
    """The log10 levels a place must reach, one per target of ``model``: the benchmark pair
    (default the service's FCC pair) for download and upload, or its one number for a
    one-target speed model.

    Raises:
        InputDataError: for a latency model (a benchmark is a pair of speeds).
    """
    pair = default_benchmark(model.info.service) if benchmark is None else Benchmark.parse(benchmark)
    by_target = dict(zip(("download", "upload"), pair.log10_levels, strict=True))
    missing = [t for t in model.targets if t not in by_target]
    if missing:
        raise InputDataError(f"a benchmark is a download/upload pair; the {model.kind} model predicts {missing[0]}")
    return tuple(by_target[t] for t in model.targets)


def plan_hexagon_visits(
    model: GeoModel, budget: int, *, tests_per_visit: int = 5, resolution: int = 8,
    benchmark: str | Benchmark | None = None, quarter: str | None = None, progress: bool = True,
) -> gpd.GeoDataFrame:
    """``budget`` visits of ``tests_per_visit`` tests among the resolution-``resolution`` H3
    hexagons of the model's region, chosen by :func:`~geodbk.decisions.plan.plan_visits` on the
    joint posterior of the hexagons' mean speeds (:meth:`GeoModel.posterior`) at ``quarter``
    (default the latest fitted).

    Returns:
        one row per visit: ``rank``, ``h3``, ``p_meets`` (now), ``expected_wrong_before`` and
        ``expected_wrong_after`` (the expected number of wrong hexagon decisions before this
        visit and after it and every earlier one), ``geometry`` (EPSG:4326).
    """
    levels = decision_levels(model, benchmark)
    cover = HexagonCover.over(model.fitted_region().geometry, resolution)
    if len(cover.ids) == 0:
        raise InputDataError(f"the model's region holds no resolution-{resolution} hexagon centre")
    points, hexagon, weights = cover.tile_points()
    posterior = model.posterior(points, quarter, groups=hexagon, n_groups=len(cover.ids), weights=weights)
    plan = plan_visits(posterior, levels, budget, tests_per_visit=tests_per_visit, progress=progress)
    table = plan.to_frame()
    sites = table.pop("site").to_numpy(np.int64)
    table.insert(1, "h3", np.asarray(cover.ids)[sites])
    return gpd.GeoDataFrame(table, geometry=np.asarray(cover.polygons())[sites], crs="EPSG:4326")


__all__ = ["decision_levels", "plan_hexagon_visits"]
