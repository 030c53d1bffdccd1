"""Map-time covariates from another Ookla layer: :class:`TestDensityCovariates`.

A mobile tile's own test count says where people use the network (busy tiles are faster),
but an unobserved map cell has none. Another layer that covers the cell does: the
fixed-broadband tiles of the same region are a separate Ookla dataset, present where
households test their home connection, and known at every cell of a map. The covariates are

    c_r(x) = log(1 + T_r(x)) / 5 - 1,   r in :data:`DENSITY_RADII_M`,

where T_r(x) is the layer's number of tests (summed over its quarters) in tiles whose centre
lies in the square of half-side r metres around x, in the model's projection. The affine
scaling puts them on about [-1, 1.5], like the other inputs.

Why hand-written rather than a KD-tree ball query (scipy): a map asks for millions of cells,
and a ball query returns one Python list of neighbours a cell; a summed-area table of the
layer's tests on a grid of :data:`CELL_M` cells answers each window in four lookups. A tile
counts in a window when its grid cell does, so a window's edge is exact to one cell.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import pandas as pd
import torch

from geodbk.dataset.coords import ProjectedTransform
from geodbk.errors import InputDataError
from geodbk.ingest.quadkey import quadkey_centres
from geodbk.ingest.regions import DEFAULT_BUFFER_DEG, Region
from geodbk.ingest.scan import scan_tiles

#: Half-sides of the covariates' windows, metres. Chosen on the validation rows of PR and HI
#: (dbk-rbf, seed 0; spatial-block PR / HI, then random and forecast on HI): none 0.732 /
#: 0.814; 3 km 0.731 / 0.810; 2, 5, 20 km 0.736 / 0.800; 1, 3, 10 km 0.732 / 0.793; these four
#: 0.732 / 0.786, with HI random 0.572 against 0.568 with none and HI forecast 0.555 against 0.558.
DENSITY_RADII_M: tuple[float, ...] = (1000.0, 3000.0, 10000.0, 30000.0)
#: Side of the summed-area table's cells, metres.
CELL_M = 250.0
#: Most cells the table may have; a wider layer gets larger cells.
MAX_CELLS = 20_000_000


@dataclass(frozen=True, eq=False)  # arrays: compared by identity
class TestDensityCovariates:
    """Test-count density of another tile layer around any place: model inputs known at every cell.

    Attributes:
        xy_m: (m, 2) projected x, y of the layer's tile centres, metres (the model's projection).
        tests: (m,) tests of each tile, summed over the layer's quarters.
        radii_m: half-sides of the windows, metres; one covariate each.
        source: what the layer is, for the model's description (e.g. ``"fixed"``).
    """

    __test__ = False  # not a pytest class, despite its name

    xy_m: np.ndarray
    tests: np.ndarray
    radii_m: tuple[float, ...] = DENSITY_RADII_M
    source: str = "fixed"

    def __post_init__(self) -> None:
        if self.xy_m.ndim != 2 or self.xy_m.shape[1] != 2 or len(self.xy_m) != len(self.tests):
            raise InputDataError(
                f"density layer needs (m, 2) places and (m,) tests, got {self.xy_m.shape}, {self.tests.shape}"
            )
        if len(self.tests) == 0:
            raise InputDataError("the density layer has no tiles in the region")
        if not (np.isfinite(self.xy_m).all() and np.isfinite(self.tests).all() and (self.tests >= 0).all()):
            raise InputDataError("the density layer's places and tests must be finite, tests >= 0")

    @classmethod
    def from_tiles(
        cls, tiles: pd.DataFrame, projection: ProjectedTransform, *, radii_m: tuple[float, ...] = DENSITY_RADII_M
    ) -> TestDensityCovariates:
        """From Ookla tiles (columns ``quadkey``, ``tests``, and ``service`` when present), one
        row per (tile, quarter) or per tile, projected with the model's ``projection``."""
        missing = {"quadkey", "tests"} - set(tiles.columns)
        if missing:
            raise InputDataError(f"density tiles lack columns {sorted(missing)}")
        per_tile = tiles.groupby(tiles["quadkey"].astype(str), sort=True)["tests"].sum()
        xy_m = projection.to_metres(quadkey_centres(per_tile.index.to_numpy(dtype=object)))
        services = sorted(set(tiles["service"].astype(str))) if "service" in tiles.columns else []
        return cls(xy_m, per_tile.to_numpy(np.float64), tuple(radii_m), ",".join(services) or "tiles")

    @property
    def names(self) -> tuple[str, ...]:
        """Column names, e.g. ``fixed_tests_1km``."""
        return tuple(f"{self.source}_tests_{r / 1000:g}km" for r in self.radii_m)

    @cached_property
    def _grid(self) -> tuple[np.ndarray, np.ndarray, float]:
        """(origin (2,) metres, summed-area table (nx + 1, ny + 1), cell side metres)."""
        pad = max(self.radii_m) + CELL_M
        lo, hi = self.xy_m.min(axis=0) - pad, self.xy_m.max(axis=0) + pad
        cell = max(CELL_M, float(np.sqrt(np.prod(hi - lo) / MAX_CELLS)))
        shape = np.ceil((hi - lo) / cell).astype(int)
        index = np.floor((self.xy_m - lo) / cell).astype(int)
        counts = np.zeros(shape, dtype=np.float64)
        np.add.at(counts, (index[:, 0], index[:, 1]), self.tests)
        table = np.zeros((shape[0] + 1, shape[1] + 1), dtype=np.float64)
        table[1:, 1:] = counts.cumsum(axis=0).cumsum(axis=1)
        return lo, table, cell

    def window_tests(self, xy_m: np.ndarray, radius_m: float) -> np.ndarray:
        """(n,) tests in the square of half-side ``radius_m`` around each of ``xy_m`` (n, 2) metres."""
        origin, table, cell = self._grid
        limit = np.array(table.shape) - 1
        first = np.clip(np.floor((xy_m - radius_m - origin) / cell).astype(np.int64) + 1, 0, limit)
        stop = np.clip(np.floor((xy_m + radius_m - origin) / cell).astype(np.int64) + 1, 0, limit)
        total = table[stop[:, 0], stop[:, 1]] - table[first[:, 0], stop[:, 1]]
        total -= table[stop[:, 0], first[:, 1]] - table[first[:, 0], first[:, 1]]
        return np.maximum(total, 0.0)  # cumulative sums of large counts can round a hair below 0

    def columns(self, xy_m: np.ndarray) -> np.ndarray:
        """(n, k) covariates log(1 + T_r) / 5 - 1 at ``xy_m`` (n, 2) metres, k = len(radii_m)."""
        xy_m = np.asarray(xy_m, dtype=np.float64).reshape(-1, 2)
        return np.column_stack([np.log1p(self.window_tests(xy_m, r)) / 5.0 - 1.0 for r in self.radii_m])

    def to_dict(self) -> dict[str, Any]:
        """Torch-saveable dict (weights-only readable)."""
        return {
            "xy_m": torch.tensor(np.array(self.xy_m)),
            "tests": torch.tensor(np.array(self.tests)),
            "radii_m": list(self.radii_m),
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TestDensityCovariates:
        return cls(
            d["xy_m"].cpu().numpy().astype(np.float64),
            d["tests"].cpu().numpy().astype(np.float64),
            tuple(float(r) for r in d["radii_m"]),
            str(d["source"]),
        )


#: What names a density layer: tiles in a frame, or files / URLs of them.
DensitySource: TypeAlias = pd.DataFrame | str | Path | Sequence[str | Path]


def read_density_tiles(
    source: DensitySource, region: Region, *, buffer_deg: float = DEFAULT_BUFFER_DEG
) -> pd.DataFrame:
    """The density layer's tiles in ``region`` (grown by ``buffer_deg`` degrees): a frame as
    given, or files and URLs streamed by :func:`geodbk.ingest.scan.scan_tiles` (every quarter;
    the files must hold one service)."""
    if isinstance(source, pd.DataFrame):
        return source
    return scan_tiles(source, region, buffer_deg=buffer_deg)
