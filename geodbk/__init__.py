"""geodbk: calibrated, non-stationary maps of mobile internet quality.

Data flows one way, and the subpackages show it: ingest -> dataset -> models -> maps
(the gridding engine) -> fit (trainer, GeoModel) -> io -> apps (the CLI, the demo workflow
and the dashboard); see docs/architecture.md. The names below are the public API; they are
imported lazily so that ``geodbk --help`` and light uses do not pay for torch, geopandas and
xarray at import time.

>>> import geodbk
>>> ds = geodbk.load_sample_dataset("PR", quarters="2023Q4")        # doctest: +SKIP
>>> model = geodbk.fit_dataset(ds, "dbk-rbf")                        # doctest: +SKIP
>>> plan = model.plan(0.01, ds.region)                               # doctest: +SKIP
>>> print(plan.describe())                                           # doctest: +SKIP
>>> grid = model.grid(plan)                                          # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    # ingest
    "read_tiles": "geodbk.ingest.ookla",
    "ookla_url": "geodbk.ingest.ookla",
    "Region": "geodbk.ingest.regions",
    "load_region": "geodbk.ingest.regions",
    "clip_to_region": "geodbk.ingest.regions",
    "tag_urban_rural": "geodbk.ingest.urbanrural",
    # dataset
    "CoordinateTransform": "geodbk.dataset.coords",
    "ProjectedTransform": "geodbk.dataset.coords",
    "InputSpace": "geodbk.dataset.inputs",
    "TestDensityCovariates": "geodbk.dataset.density",
    "read_density_tiles": "geodbk.dataset.density",
    "SpatialDataset": "geodbk.dataset.spatial_dataset",
    "build_dataset": "geodbk.dataset.spatial_dataset",
    "load_sample_dataset": "geodbk.dataset.spatial_dataset",
    # model
    "ModelConfig": "geodbk.models",
    "TrainConfig": "geodbk.models",
    "run_preset": "geodbk.models",
    "fit_arrays": "geodbk.fit.train",
    "Prediction": "geodbk.prediction",
    "ChangePrediction": "geodbk.prediction",
    "to_data_units": "geodbk.prediction",
    "Regressor": "geodbk.fit.regressor",
    "GeoModel": "geodbk.fit.geomodel",
    "DBKRegressor": "geodbk.fit.estimator",
    "fit_dataset": "geodbk.fit.fitting",
    "ModelInfo": "geodbk.dataset.model_info",
    "Protocol": "geodbk.dataset.protocols",
    "evaluate": "geodbk.fit.metrics",
    "ExtrapolationWarning": "geodbk.errors",
    # grids and export
    "MapPlan": "geodbk.maps.plan",
    "predict_grid": "geodbk.maps.predict",
    "reference_points": "geodbk.maps.reference",
    "open_grid": "geodbk.maps.stores",
    "GridLayers": "geodbk.maps.schema",
    "summarize_polygons": "geodbk.maps.summaries",
    "write_summary": "geodbk.maps.summaries",
    "default_threshold": "geodbk.maps.thresholds",
    "write_geotiff": "geodbk.io.geotiff",
    "write_netcdf": "geodbk.io.cubes",
    "write_zarr": "geodbk.io.cubes",
    "tile_predictions": "geodbk.io.vectors",
    "write_tile_predictions": "geodbk.io.vectors",
    "run_demo": "geodbk.workflow",
    "RunFolder": "geodbk.workflow",
}

__all__ = sorted(_EXPORTS)

#: Modules that make, read or write grid datasets: resolving a name from one of them also
#: imports geodbk.io.accessor, which registers the ``.dbk`` accessor on xarray datasets
#: (``import geodbk`` alone stays free of xarray).
_GRID_MODULES = ("geodbk.maps.", "geodbk.io.", "geodbk.fit.geomodel", "geodbk.workflow")


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'geodbk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    if module.startswith(_GRID_MODULES):
        importlib.import_module("geodbk.io.accessor")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
