"""geodbk: calibrated, non-stationary maps of mobile internet quality.

Data flows one way: ingest -> dataset -> model -> grids -> apps/export. The names below
are the public API; they are imported lazily so that ``geodbk --help`` and light uses
do not pay for torch, geopandas and xarray at import time.

>>> import geodbk
>>> ds = geodbk.load_sample_dataset("PR", quarters="2023Q4")        # doctest: +SKIP
>>> model = geodbk.fit_dataset(ds, "dbk-rbf")                        # doctest: +SKIP
>>> grid = geodbk.predict_region(model, ds.region, resolution=0.01)  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    # ingest
    "read_tiles": "geodbk.ookla",
    "ookla_url": "geodbk.ookla",
    "Region": "geodbk.regions",
    "load_region": "geodbk.regions",
    "clip_to_region": "geodbk.regions",
    "tag_urban_rural": "geodbk.urbanrural",
    # dataset
    "CoordinateTransform": "geodbk.coords",
    "ProjectedTransform": "geodbk.coords",
    "InputSpace": "geodbk.inputs",
    "SpatialDataset": "geodbk.dataset",
    "build_dataset": "geodbk.dataset",
    "load_sample_dataset": "geodbk.dataset",
    # model
    "ModelConfig": "geodbk.models",
    "TrainConfig": "geodbk.train",
    "fit_arrays": "geodbk.train",
    "Prediction": "geodbk.prediction",
    "ChangePrediction": "geodbk.prediction",
    "to_data_units": "geodbk.prediction",
    "Regressor": "geodbk.regressor",
    "GeoModel": "geodbk.geomodel",
    "fit_dataset": "geodbk.geomodel",
    "evaluate": "geodbk.metrics",
    "ExtrapolationWarning": "geodbk.errors",
    # grids and export
    "predict_grid": "geodbk.grids",
    "predict_region": "geodbk.grids",
    "reference_points": "geodbk.grids",
    "open_grid": "geodbk.grids",
    "GridLayers": "geodbk.layers",
    "summarize_polygons": "geodbk.summaries",
    "write_summary": "geodbk.summaries",
    "default_threshold": "geodbk.thresholds",
    "write_geotiff": "geodbk.export",
    "write_netcdf": "geodbk.export",
    "write_zarr": "geodbk.export",
    "tile_predictions": "geodbk.export",
    "write_tile_predictions": "geodbk.export",
    "run_demo": "geodbk.workflow",
    "RunFolder": "geodbk.workflow",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'geodbk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
