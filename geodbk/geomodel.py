"""A fitted model in geographic terms: :class:`GeoModel` = Regressor + CoordinateTransform.

Inputs are lon/lat in degrees (EPSG:4326); the transform maps them to the [-1, 1]^2
coordinates the regressor was fitted on. Outputs are in the target's log10 units.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from geodbk.dataset import CoordinateTransform, SpatialDataset
from geodbk.errors import InputDataError
from geodbk.models.config import ModelConfig
from geodbk.prediction import Prediction
from geodbk.regressor import Regressor, read_payload, write_payload
from geodbk.train import TrainConfig, fit_arrays


def _lonlat(a: np.ndarray, name: str) -> np.ndarray:
    arr = np.asarray(a, dtype=np.float64)
    if arr.ndim == 1 and arr.shape[0] == 2:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise InputDataError(f"{name} must have shape (n, 2) as (lon, lat) degrees, got {arr.shape}")
    return arr


@dataclass
class GeoModel:
    """A regressor on scaled coordinates plus what is needed to use it on a map.

    Attributes:
        regressor: the fitted model on [-1, 1]^2 inputs.
        transform: the region's lon/lat <-> [-1, 1]^2 transform.
        meta: JSON-able facts: target, units, region, kind, quarters, and anything else.
    """

    regressor: Regressor
    transform: CoordinateTransform
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.regressor.kind

    def predict(self, lonlat: np.ndarray, batch_size: int = 65536) -> Prediction:
        """Predictive distribution of log10(value) at ``lonlat`` (n, 2) degrees."""
        xy = self.transform.to_unit(_lonlat(lonlat, "lonlat"))
        return self.regressor.predict(xy, batch_size=batch_size)

    def kernel_slice(self, lonlat: np.ndarray, ref_lonlat: np.ndarray) -> np.ndarray:
        """Prior kernel k(x, x_ref), (n, k), in (log10 units)^2; inputs in degrees."""
        xy = self.transform.to_unit(_lonlat(lonlat, "lonlat"))
        ref = self.transform.to_unit(_lonlat(ref_lonlat, "ref_lonlat"))
        return self.regressor.kernel(xy, ref)

    def prior_variance(self, lonlat: np.ndarray) -> np.ndarray:
        """Prior variance k(x, x), (n,), in (log10 units)^2; the diagonal of :meth:`kernel_slice`."""
        return self.regressor.prior_variance(self.transform.to_unit(_lonlat(lonlat, "lonlat")))

    def save(self, path: str | Path) -> None:
        """Write the model, transform and meta to one torch file."""
        payload = {
            "format": "geodbk.geomodel/1",
            "regressor": self.regressor.to_payload(),
            "transform": self.transform.to_dict(),
            "meta": self.meta,
        }
        write_payload(payload, path)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> "GeoModel":
        """Read a file written by :meth:`save`; tensors are mapped to ``device``."""
        payload = read_payload(path, device)
        if payload.get("format") != "geodbk.geomodel/1":
            raise InputDataError(f"{path} is not a geodbk GeoModel file")
        return cls(
            regressor=Regressor.from_payload(payload["regressor"], device),
            transform=CoordinateTransform.from_dict(payload["transform"]),
            meta=payload["meta"],
        )


def fit_dataset(
    dataset: SpatialDataset,
    kind: str = "dbk-rbf",
    *,
    model_config: ModelConfig | None = None,
    train_config: TrainConfig | None = None,
) -> GeoModel:
    """Fit ``kind`` on the dataset's train split, selecting on its val split."""
    X, y, _ = dataset.arrays("train")
    X_val, y_val, _ = dataset.arrays("val")
    regressor = fit_arrays(kind, X, y, X_val, y_val, model_config=model_config, train_config=train_config)
    meta = {
        "kind": kind,
        "target": dataset.target,
        "units": dataset.units,
        "region": dataset.region.name,
        "quarters": dataset.quarters,
        "n_train": int(len(y)),
    }
    return GeoModel(regressor, dataset.transform, meta)
