"""Held-out tiles with a model's predictions (log10 and data units) as GeoJSON or GeoParquet."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import geopandas as gpd
import numpy as np

from geodbk.dataset.targets import target_column
from geodbk.errors import InputDataError
from geodbk.fileio import atomic_path
from geodbk.maps.thresholds import Benchmark, default_benchmark
from geodbk.prediction import probability_pair_above, to_data_units

if TYPE_CHECKING:  # pragma: no cover - typing only
    from geodbk.dataset.spatial_dataset import SpatialDataset
    from geodbk.fit.geomodel import GeoModel


def tile_predictions(
    model: GeoModel, dataset: SpatialDataset, *, split: str = "test", benchmark: str | Benchmark | None = None
) -> gpd.GeoDataFrame:
    """The tiles of one split of ``dataset`` with ``model``'s predictions, one row per (tile, quarter).

    Each row is predicted at its own quarter, as a new measurement with its own number of
    tests (:meth:`geodbk.fit.geomodel.GeoModel.predict_tiles`), the distribution its observed
    value is scored against.

    Columns: ``quadkey, year, quarter, tests, urban_rural, lon, lat`` (tile centre, degrees),
    the observation ``y`` (log10) and ``observed_<u>`` (data units, e.g. ``observed_mbps``),
    the prediction ``mean, sd, lower, upper, pi_width`` (log10) and ``mean_<u>, lower_<u>,
    upper_<u>`` (10 ** the log10 median and interval ends), ``inside_pi`` (observation inside the 95% interval),
    and ``geometry`` (tile polygon, EPSG:4326). A two-target model (download and upload) adds
    ``observed_download_mbps`` and ``observed_upload_mbps`` and, for a new measurement of the
    tile's own tests, ``p_meets`` (both speeds reach ``benchmark``, default the service's FCC
    pair), ``p_meets_download`` and ``p_meets_upload``; its other columns are the first target's.
    """
    frame = dataset.frame
    if "split" not in frame.columns:
        raise InputDataError("dataset frame has no 'split' column")
    tiles = frame[frame["split"] == split]
    if len(tiles) == 0:
        raise InputDataError(f"dataset has no tiles in split {split!r}")
    pred = model.predict_tiles(tiles).measurement()
    mean = np.asarray(pred.mean, dtype=np.float64)
    sd = np.asarray(pred.sd, dtype=np.float64)
    key = str(getattr(dataset, "units", "Mbps")).lower()
    y = tiles["y"].to_numpy(np.float64)
    lower, upper = pred.lower, pred.upper  # the measurement's central 95% interval (its shape's)
    keep = [c for c in ("quadkey", "year", "quarter", "tests", "urban_rural", "lon", "lat") if c in tiles.columns]
    out = tiles[keep].copy()
    out["y"] = y
    out[f"observed_{key}"] = tiles["value"].to_numpy(np.float64)
    out["mean"] = mean
    out["sd"] = sd
    out["lower"] = lower
    out["upper"] = upper
    out["pi_width"] = upper - lower
    out[f"mean_{key}"], out[f"lower_{key}"], out[f"upper_{key}"] = to_data_units(mean, sd, pred.shape)
    out["inside_pi"] = (y >= lower) & (y <= upper)
    if len(model.targets) == 2:
        out = out.assign(**_benchmark_columns(model, dataset, tiles, benchmark))
    geometry = tiles.geometry.to_numpy()
    return gpd.GeoDataFrame(out.reset_index(drop=True), geometry=geometry, crs=tiles.crs or "EPSG:4326")


def _benchmark_columns(
    model: GeoModel, dataset: SpatialDataset, tiles: gpd.GeoDataFrame, benchmark: str | Benchmark | None
) -> dict[str, np.ndarray]:
    """The two-target columns of :func:`tile_predictions`: observed speeds and P(meets)."""
    levels = (default_benchmark(model.info.service) if benchmark is None else Benchmark.parse(benchmark)).log10_levels
    if set(model.targets) != {"download", "upload"} or set(dataset.targets) < set(model.targets):
        raise InputDataError(f"a benchmark needs download and upload in the model and the dataset; "
                             f"the model has {', '.join(model.targets)}, the dataset {', '.join(dataset.targets)}")
    with_tests = {t: model.for_target(t).predict_tiles(tiles) for t in ("download", "upload")}
    assert model.correlation is not None  # every two-target model has one
    rho = model.correlation.measurement(with_tests["download"], with_tests["upload"])
    # a new measurement of the tile's own tests: each marginal its own shape, joined by a Gaussian copula
    download, upload = with_tests["download"].measurement(), with_tests["upload"].measurement()
    columns = {f"observed_{t}_mbps": tiles[target_column(dataset.target, t, "value")].to_numpy(np.float64)
               for t in ("download", "upload")}
    columns["p_meets"] = probability_pair_above(download, upload, rho, *levels)
    columns["p_meets_download"] = download.probability_above(levels[0])
    columns["p_meets_upload"] = upload.probability_above(levels[1])
    return columns


def write_tile_predictions(
    model: GeoModel, dataset: SpatialDataset, path: str | Path, *, split: str = "test",
    benchmark: str | Benchmark | None = None,
) -> Path:
    """Write :func:`tile_predictions` to ``*.geojson`` (GeoJSON) or ``*.parquet`` (GeoParquet), atomically."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".geojson", ".json", ".parquet", ".geoparquet"):
        raise InputDataError(f"test tiles go to .geojson or .parquet, got {path.name}")
    frame = tile_predictions(model, dataset, split=split, benchmark=benchmark)
    with atomic_path(path) as tmp:
        if suffix in (".geojson", ".json"):
            frame.to_file(tmp, driver="GeoJSON", engine="pyogrio")
        else:
            frame.to_parquet(tmp)
    return path


__all__ = ["tile_predictions", "write_tile_predictions"]
