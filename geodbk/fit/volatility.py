"""Where the map model's errors run larger or smaller than its variance says: :class:`LocalVolatility`.

The residual field's local kernel is the same everywhere, and the deep kernel's variance
follows the basis, not the errors. But some places are more volatile than others (a tile
whose speed swings from quarter to quarter, a busy district, a coast road): on HI's random
split, the training rows' leave-one-out errors, standardised by the model's own variance,
have a mean square of 1.0 overall, and a tile's rows predict the next quarter's: scaling
the new measurement's variance by their local mean square took the test NLL from 0.607 to
0.593, and on PR from 0.454 to 0.442 (HI forecast 0.745 to 0.729; HI spatial-block, whose
held-out tiles are far from any training row, 0.871 to 0.867).

So the map model's covariance is scaled by a local factor V(x) > 0,

    Cov'((x, t), (x', t')) = sqrt(V(x) V(x')) Cov((x, t), (x', t')),

which keeps it a covariance (a diagonal scaling), as the forecast horizon's factor does
(:meth:`~geodbk.fit.residuals.ResidualField.horizon_factor`); means do not change. V is a
shrunk local mean of the training rows' squared standardised leave-one-out errors z^2:

    V(x) = (a + sum_k w_k S_k) / (a + sum_k w_k N_k),

over the :data:`NEIGHBOUR_TILES` training tiles k nearest to x's tile, S_k the sum of z^2 / mean(z^2)
(each z^2 capped at :data:`Z2_CAP`) over tile k's N_k rows, and w_k = 1 for x's own tile and
c exp(-d_k / rho) for the others, d_k metres. A place with no training tile near gets
V = 1: the variance the model already has. Dividing by the mean of z^2 keeps V relative:
the overall level is what the residual field's kernel and the measurement family chose on
validation rows. The prior weight a, the neighbour weight c and the range rho are chosen by
the Gaussian NLL of the validation rows, on a grid (:data:`PRIOR_ROWS`,
:data:`NEIGHBOUR_WEIGHTS`, :data:`RANGES_M`); V = 1 everywhere is one of the choices.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from scipy.spatial import cKDTree

from geodbk.blocks import blocks
from geodbk.dataset.coords import ProjectedTransform
from geodbk.fit.metrics import nll
from geodbk.ingest.quadkey import SAME_TILE_M, tile_centres
from geodbk.prediction import Prediction

#: Training tiles each place pools (nearest first).
NEIGHBOUR_TILES = 64
#: Cap on one row's squared standardised error: one wild measurement should not set a tile's scale.
Z2_CAP = 50.0
#: The grids the three parameters are chosen on; c at most 1, so that a neighbour's row never
#: counts for more than one of the place's own tile.
PRIOR_ROWS = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
NEIGHBOUR_WEIGHTS = (0.0, 0.03, 0.1, 0.3, 1.0)
RANGES_M = (500.0, 1000.0, 2000.0, 4000.0)
#: Validation rows the parameters are chosen on (callers pass a random subset of more), and
#: points per block of :meth:`LocalVolatility.factor` (bounds its (rows, K) temporaries to about 40 MB).
FIT_ROWS = 50_000
_BLOCK = 65_536


@dataclass
class LocalVolatility:
    """The local variance factor V(x) of the map model.

    Attributes:
        projection: lon/lat -> metres.
        xy_m: (k, 2) centres of the training tiles, metres.
        sum_z2: (k,) each tile's sum of relative squared errors z^2 / mean(z^2) over its rows.
        rows: (k,) each tile's number of training rows.
        prior_rows: a, how many rows' worth of V = 1 each place starts from.
        neighbour_weight: c, the weight of a neighbouring tile's rows next to the place's own.
        range_m: rho, metres over which a neighbour's weight decays.
    """

    projection: ProjectedTransform
    xy_m: np.ndarray
    sum_z2: np.ndarray
    rows: np.ndarray
    prior_rows: float
    neighbour_weight: float
    range_m: float

    def __post_init__(self) -> None:
        self._tree = cKDTree(self.xy_m)
        #: the last places asked (a digest of their bytes) and their factor: a map of several
        #: quarters asks for the same block of cells once per quarter
        self._last: tuple[bytes, np.ndarray] | None = None

    @classmethod
    def from_rows(
        cls, projection: ProjectedTransform, xy_m: np.ndarray, z2: np.ndarray,
        prior_rows: float = 8.0, neighbour_weight: float = 0.1, range_m: float = 1000.0,
    ) -> LocalVolatility:
        """The factor from training rows' tile centres ``xy_m`` (n, 2) metres and squared
        standardised errors ``z2`` (n,), summed per tile after capping and dividing by their mean."""
        z2 = np.minimum(np.asarray(z2, np.float64), Z2_CAP)
        z2 = z2 / max(float(z2.mean()), 1e-12)
        tiles, tile = np.unique(np.round(np.asarray(xy_m, np.float64), 3), axis=0, return_inverse=True)
        tile = tile.reshape(-1)
        return cls(projection, tiles, np.bincount(tile, weights=z2), np.bincount(tile).astype(np.float64),
                   prior_rows, neighbour_weight, range_m)

    def _pool(self, xy_m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Distances (n, K) metres and indices (n, K) of the K training tiles nearest each point."""
        k = min(NEIGHBOUR_TILES, len(self.xy_m))
        distance, index = self._tree.query(xy_m, k=k)
        return distance.reshape(len(xy_m), k), index.reshape(len(xy_m), k)

    def _factor(
        self, distance: np.ndarray, index: np.ndarray, prior_rows: float, neighbour_weight: float, range_m: float
    ) -> np.ndarray:
        weight = np.where(distance < SAME_TILE_M, 1.0, neighbour_weight * np.exp(-distance / range_m))
        return (prior_rows + (weight * self.sum_z2[index]).sum(-1)) / (prior_rows + (weight * self.rows[index]).sum(-1))

    def factor(self, lonlat: np.ndarray) -> np.ndarray:
        """V at the tiles of ``lonlat`` (n, 2) degrees, (n,)."""
        lonlat = np.ascontiguousarray(lonlat, dtype=np.float64).reshape(-1, 2)
        key = hashlib.blake2b(lonlat.tobytes(), digest_size=16).digest()
        last = self._last
        if last is not None and last[0] == key:
            return last[1].copy()
        out = np.empty(len(lonlat))
        for rows in blocks(len(lonlat), _BLOCK):
            xy = self.projection.to_metres(tile_centres(lonlat[rows]))
            out[rows] = self._factor(*self._pool(xy), self.prior_rows, self.neighbour_weight, self.range_m)
        self._last = (key, out)
        return out.copy()

    @classmethod
    def fit(
        cls, projection: ProjectedTransform, xy_m: np.ndarray, z2: np.ndarray,
        val_lonlat: np.ndarray, val_error: np.ndarray, val_var: np.ndarray,
    ) -> LocalVolatility | None:
        """Choose a, c and rho by the Gaussian NLL of the validation rows' errors ``val_error`` (n,)
        under ``N(0, V val_var)``, ``val_lonlat`` (n, 2) degrees; ``None`` when V = 1 does best.
        ``xy_m``, ``z2``: as in :meth:`from_rows`."""
        volatility = cls.from_rows(projection, xy_m, z2)
        error, var = np.asarray(val_error, np.float64), np.asarray(val_var, np.float64)
        pooled = volatility._pool(projection.to_metres(tile_centres(np.asarray(val_lonlat, np.float64))))
        best, best_nll = None, nll(error, Prediction(np.zeros_like(error), np.sqrt(var)))
        for a, c, rho in itertools.product(PRIOR_ROWS, NEIGHBOUR_WEIGHTS, RANGES_M):
            if c == 0.0 and rho != RANGES_M[0]:
                continue  # without neighbours the range does nothing
            score = nll(error, Prediction(np.zeros_like(error), np.sqrt(volatility._factor(*pooled, a, c, rho) * var)))
            if score < best_nll:
                best, best_nll = (a, c, rho), score
        if best is None:
            return None
        prior_rows, neighbour_weight, range_m = best
        return replace(volatility, prior_rows=prior_rows, neighbour_weight=neighbour_weight, range_m=range_m)

    def to_payload(self) -> dict[str, Any]:
        """Torch-saveable dict."""
        return {
            "projection": self.projection.to_dict(),
            "prior_rows": self.prior_rows,
            "neighbour_weight": self.neighbour_weight,
            "range_m": self.range_m,
            **{name: torch.tensor(np.array(getattr(self, name))) for name in ("xy_m", "sum_z2", "rows")},
        }

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> LocalVolatility:
        xy_m, sum_z2, rows = (payload[name].cpu().numpy() for name in ("xy_m", "sum_z2", "rows"))
        return cls(ProjectedTransform.from_dict(payload["projection"]), xy_m, sum_z2, rows,
                   float(payload["prior_rows"]), float(payload["neighbour_weight"]), float(payload["range_m"]))
