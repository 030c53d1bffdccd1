"""The decision view's data: where a download/upload model says places meet a speed benchmark.

A run folder of a two-target model (download and upload) holds, per model kind,
``decisions/<kind>_h3.parquet`` (one row per H3 hexagon of the region:
:func:`geodbk.decisions.hexagon_summary.summarize_hexagons`) and ``decisions/<kind>_plan.parquet``
(the next visits, :func:`geodbk.decisions.visits.plan_hexagon_visits`). The table carries each
hexagon's mean and sd of log10 download and upload and their correlation, so P(meets) of any
benchmark ``D/U`` Mbps is recomputed from it without the model (:func:`p_meets`):

    P(meets) = P(log10 download >= log10 D and log10 upload >= log10 U)

under the bivariate normal of the two hexagon means (:func:`geodbk.prediction.probability_both_above`).
This module turns the tables into what the dashboard draws: Web Mercator rings (:func:`hexagon_rings`),
one line of summary (:func:`decision_summary`) and the plan's rank labels (:func:`plan_marks`).
"""

from __future__ import annotations

from dataclasses import dataclass

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely

from geodbk.errors import InputDataError
from geodbk.maps.thresholds import Benchmark
from geodbk.prediction import probability_both_above
from geodbk.viewer.mercator import TO_MERCATOR

#: The benchmarks the view offers (download/upload Mbps): the FCC's 5/1 and 7/1 (5G Fund
#: coverage), and 35/3 (the mobile pair of its broadband maps), with the table's own if another.
BENCHMARK_CHOICES: tuple[str, ...] = ("5/1", "7/1", "35/3")
#: Columns a hexagon table needs for the view.
TABLE_COLUMNS: tuple[str, ...] = (
    "h3", "mean_log10_download", "sd_log10_download", "mean_log10_upload", "sd_log10_upload", "correlation",
    "median_download_mbps", "median_upload_mbps", "observed_tiles", "geometry",
)  # fmt: skip
#: The one-line note shown for a model without a hexagon table.
NO_DECISIONS = (
    "No decision view for {kind}: it predicts {targets} only. Fit download and upload together to see decisions "
    "(`geodbk demo` fits dbk-rbf on both speeds)."
)


def check_table(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` if it has every column of :data:`TABLE_COLUMNS`, else a one-line InputDataError."""
    missing = [column for column in TABLE_COLUMNS if column not in table.columns]
    if missing:
        raise InputDataError(f"a hexagon table of download and upload needs the columns {', '.join(missing)}")
    return table


def table_benchmark(table: pd.DataFrame) -> str:
    """The benchmark the table's ``p_meets`` is of (``"35/3"``), the view's default; 35/3 when
    the table does not say."""
    if "benchmark" in table.columns and len(table):
        return str(Benchmark.parse(str(table["benchmark"].iloc[0])))
    return "35/3"


def benchmark_options(table: pd.DataFrame) -> list[str]:
    """:data:`BENCHMARK_CHOICES` and the table's own benchmark, slowest first."""
    choices = {str(Benchmark.parse(b)) for b in (*BENCHMARK_CHOICES, table_benchmark(table))}
    return sorted(choices, key=lambda b: Benchmark.parse(b).log10_levels)


def p_meets(table: pd.DataFrame, benchmark: str | Benchmark) -> np.ndarray:
    """(n,) P(the hexagon's mean download and upload both reach ``benchmark``), from the table's
    means, sds and correlation (log10 Mbps): the table's own ``p_meets`` for its benchmark."""
    download, upload = Benchmark.parse(benchmark).log10_levels
    return probability_both_above(
        table["mean_log10_download"].to_numpy(np.float64),
        table["sd_log10_download"].to_numpy(np.float64),
        table["mean_log10_upload"].to_numpy(np.float64),
        table["sd_log10_upload"].to_numpy(np.float64),
        table["correlation"].to_numpy(np.float64),
        download,
        upload,
    )


@dataclass(frozen=True)
class DecisionSummary:
    """One benchmark over a table's hexagons.

    Attributes:
        benchmark: ``"35/3"``.
        hexagons: number of hexagons.
        likely_meet: hexagons with P(meets) >= 0.5 (the decision "meets").
        mean_p: the mean P(meets), the expected share of hexagons that meet.
        expected_wrong: sum of min(p, 1 - p): the expected number of wrong decisions.
    """

    benchmark: str
    hexagons: int
    likely_meet: int
    mean_p: float
    expected_wrong: float

    def text(self) -> str:
        """``"35/3 Mbps: 12,034 of 17,675 hexagons likely meet it (P ≥ 0.5); ..."``."""
        return (
            f"**{self.benchmark} Mbps**: {self.likely_meet:,} of {self.hexagons:,} hexagons likely meet it "
            f"(P ≥ 0.5); mean P(meets) {self.mean_p:.3f}; expected wrong decisions {self.expected_wrong:.1f}"
        )


def decision_summary(p: np.ndarray, benchmark: str | Benchmark) -> DecisionSummary:
    """The :class:`DecisionSummary` of probabilities ``p`` (n,) of meeting ``benchmark`` (NaN left out)."""
    p = np.asarray(p, dtype=np.float64)
    p = p[np.isfinite(p)]
    return DecisionSummary(
        benchmark=str(Benchmark.parse(benchmark)),
        hexagons=int(p.size),
        likely_meet=int((p >= 0.5).sum()),
        mean_p=float(p.mean()) if p.size else float("nan"),
        expected_wrong=float(np.minimum(p, 1.0 - p).sum()),
    )


def hexagon_rings(geometry: gpd.GeoSeries | np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``(xs, ys)``: each polygon's exterior ring in Web Mercator metres (one array per polygon),
    the ``patches`` of a Bokeh plot."""
    rings = shapely.get_exterior_ring(np.asarray(geometry, dtype=object))
    coords = shapely.get_coordinates(rings)
    counts = shapely.get_num_coordinates(rings)
    x, y = TO_MERCATOR.transform(coords[:, 0], coords[:, 1])
    splits = np.cumsum(counts)[:-1]
    return list(np.split(np.asarray(x), splits)), list(np.split(np.asarray(y), splits))


def hexagon_columns(table: pd.DataFrame) -> dict[str, object]:
    """The columns of the hexagon plot that do not depend on the benchmark: ``xs``/``ys``
    (Mercator rings), ``h3``, ``download``/``upload`` (median Mbps), ``observed_tiles``."""
    check_table(table)
    xs, ys = hexagon_rings(table.geometry)
    return {
        "xs": xs,
        "ys": ys,
        "h3": table["h3"].astype(str).to_numpy(dtype=object),
        "download": table["median_download_mbps"].to_numpy(np.float64),
        "upload": table["median_upload_mbps"].to_numpy(np.float64),
        "observed_tiles": table["observed_tiles"].to_numpy(np.int64),
    }


def plan_marks(plan: gpd.GeoDataFrame) -> dict[str, object]:
    """The plan's hexagons as drawn: ``xs``/``ys`` (Mercator rings), ``x``/``y`` (a point inside
    each, for its label), ``rank`` (1 = first visit) and ``label`` (its text)."""
    order = plan.sort_values("rank")
    xs, ys = hexagon_rings(order.geometry)
    inside = shapely.point_on_surface(np.asarray(order.geometry, dtype=object))
    x, y = TO_MERCATOR.transform(shapely.get_x(inside), shapely.get_y(inside))
    ranks = order["rank"].to_numpy(np.int64)
    return {
        "xs": xs,
        "ys": ys,
        "x": np.asarray(x, dtype=np.float64),
        "y": np.asarray(y, dtype=np.float64),
        "rank": ranks,
        "label": np.array([str(r) for r in ranks], dtype=object),
        "h3": order["h3"].astype(str).to_numpy(dtype=object),
    }


__all__ = [
    "BENCHMARK_CHOICES", "DecisionSummary", "NO_DECISIONS", "TABLE_COLUMNS", "benchmark_options", "check_table",
    "decision_summary", "hexagon_columns", "hexagon_rings", "p_meets", "plan_marks", "table_benchmark",
]
