"""The logic of the dashboard (``apps/dashboard.py``) without its widgets: no Panel, no Bokeh.

* :mod:`~geodbk.viewer.catalog`: the run folders' fitted models and their files
  (:class:`Catalog`, :class:`Fit`), read through the cached :mod:`~geodbk.viewer.loaders`;
* :mod:`~geodbk.viewer.cells`: a saved grid's quarters and the lon/lat of its cells;
* :mod:`~geodbk.viewer.mercator`: Web Mercator (the map's coordinates) conversions;
* :mod:`~geodbk.viewer.tiles`: observed tiles of a quarter, or near a point;
* :mod:`~geodbk.viewer.correlation`: kernel slices as covariance or correlation, the posterior
  correlation with a point and the distance at which it falls to 0.5;
* :mod:`~geodbk.viewer.decisions`: a download/upload model's hexagon table and visit plan, and
  P(meets) of any benchmark recomputed from the table;
* :mod:`~geodbk.viewer.units`: predictive distributions in log10 and data units;
* :mod:`~geodbk.viewer.layers`: the map layers and their colour limits;
* :mod:`~geodbk.viewer.tables`: the area summary and metrics tables.
"""

from geodbk.viewer.catalog import Catalog, Fit, check_run_folder
from geodbk.viewer.cells import at_quarter, change_span, grid_cells_lonlat, grid_quarters, on_cells, shown_quarter
from geodbk.viewer.correlation import (
    HalfDistance,
    cell_km,
    correlation,
    half_distance,
    posterior_correlation,
    slice_at_cells,
)
from geodbk.viewer.decisions import (
    BENCHMARK_CHOICES,
    NO_DECISIONS,
    DecisionSummary,
    benchmark_options,
    decision_summary,
    p_meets,
    plan_marks,
    table_benchmark,
)
from geodbk.viewer.layers import (
    DEFAULT_LAYER,
    LAYER_BY_KEY,
    LAYERS,
    Layer,
    colour_limits,
    grid_units,
    layer_cmap,
    layer_label,
    layer_options,
    layer_variable,
    resolve_layer,
)
from geodbk.viewer.mercator import lonlat_to_mercator, mercator_raster, mercator_to_lonlat, outline_paths, with_mercator
from geodbk.viewer.tables import metrics_tables, name_column, summary_table
from geodbk.viewer.tiles import (
    ALL_QUARTERS,
    NEAR_KM,
    distance_km,
    observed_near,
    quarter_dates,
    tiles_geojson,
    tiles_in_quarter,
)
from geodbk.viewer.units import READOUT_VARIABLES, PointPrediction, Series, cell_readout, slice_units

__all__ = [
    "BENCHMARK_CHOICES", "DecisionSummary", "HalfDistance", "NO_DECISIONS", "benchmark_options", "cell_km",
    "decision_summary", "half_distance", "p_meets", "plan_marks", "posterior_correlation", "table_benchmark",
    "ALL_QUARTERS", "READOUT_VARIABLES", "Catalog", "DEFAULT_LAYER", "Fit", "LAYERS", "LAYER_BY_KEY", "Layer",
    "NEAR_KM", "PointPrediction", "Series", "at_quarter", "cell_readout", "change_span", "check_run_folder",
    "colour_limits",
    "correlation", "distance_km", "grid_cells_lonlat", "grid_quarters", "grid_units", "layer_cmap", "layer_label",
    "layer_options", "layer_variable", "lonlat_to_mercator", "mercator_raster", "mercator_to_lonlat",
    "metrics_tables", "name_column", "observed_near", "on_cells", "outline_paths", "quarter_dates", "resolve_layer",
    "shown_quarter", "slice_at_cells", "slice_units", "summary_table", "tiles_geojson", "tiles_in_quarter",
    "with_mercator",
]
