"""Map-time covariates from another Ookla layer: :class:`TestDensityCovariates`.

A mobile tile's own test count says where people use the network (busy tiles are faster),
but an unobserved map cell has none. Another layer that covers the cell does: the
fixed-broadband tiles of the same region are a separate Ookla dataset, present where
households test their home connection, and known at every cell of a map. The covariates are

    c_r(x) = log(1 + T_r(x)) / 5 - 1,   r in :data:`DENSITY_RADII_M`,

where T_r(x) is the layer's number of tests (summed over its quarters) in tiles whose centre
lies in the square of half-side r metres around x, in the model's projection, and, when the
layer has download speeds, for r in :data:`SPEED_RADII_M`,

    s_r(x) = S_r(x) / T_r(x) - 4,

S_r(x) being the tests x ln(1 + download Mbps) summed over the same window (the layer's mean
where a window holds no test): how fast the other network is around the place. The affine
scalings put every column on about [-1, 2], like the other inputs.

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

from geodbk.dataset.coords import ProjectedTransform
from geodbk.dataset.spatial_dataset import SpatialDataset, sample_tiles_path
from geodbk.errors import InputDataError
from geodbk.ingest.quadkey import quadkey_centres
from geodbk.ingest.regions import DEFAULT_BUFFER_DEG, Region
from geodbk.ingest.scan import scan_tiles

#: Half-sides of the covariates' windows, metres. Chosen on the validation rows of PR and HI
#: (dbk-rbf, seed 0; spatial-block PR / HI, then random and forecast on HI): none 0.732 /
#: 0.814; 3 km 0.731 / 0.810; 2, 5, 20 km 0.736 / 0.800; 1, 3, 10 km 0.732 / 0.793; these four
#: 0.732 / 0.786, with HI random 0.572 against 0.568 with none and HI forecast 0.555 against 0.558.
DENSITY_RADII_M: tuple[float, ...] = (1000.0, 3000.0, 10000.0, 30000.0)
#: Half-sides of the speed covariates' windows, metres. With 3 and 10 km (dbk-rbf validation
#: NLL, spatial-block, three seeds): HI 0.785 against 0.792 with the counts alone, PR 0.738
#: against 0.740. Adding 1 km: spatial-block HI 0.775 (each seed lower), PR 0.737; seed 0,
#: random PR 0.458 / HI 0.573 and forecast PR 0.439 / HI 0.555 (against 0.558), the others
#: unchanged to 0.0004. Adding 30 km instead: HI 0.790, PR 0.737.
SPEED_RADII_M: tuple[float, ...] = (1000.0, 3000.0, 10000.0)
#: Side of the summed-area table's cells, metres.
CELL_M = 250.0
#: Most cells the table may have; a wider layer gets larger cells.
MAX_CELLS = 20_000_000


@dataclass(frozen=True, eq=False)  # arrays: compared by identity
class TestDensityCovariates:
    """Test density and speed of another tile layer around any place: model inputs known at every cell.

    Attributes:
        xy_m: (m, 2) projected x, y of the layer's tile centres, metres (the model's projection).
        tests: (m,) tests of each tile, summed over the layer's quarters.
        speed: (m,) each tile's test-weighted mean of ln(1 + download Mbps) over its quarters,
            or ``None`` (density columns only).
        radii_m: half-sides of the density windows, metres; one covariate each.
        speed_radii_m: half-sides of the speed windows, metres (when there is a speed).
        source: what the layer is, for the model's description (e.g. ``"fixed"``).
    """

    __test__ = False  # not a pytest class, despite its name

    xy_m: np.ndarray
    tests: np.ndarray
    speed: np.ndarray | None = None
    radii_m: tuple[float, ...] = DENSITY_RADII_M
    speed_radii_m: tuple[float, ...] = SPEED_RADII_M
    source: str = "fixed"

    def __post_init__(self) -> None:
        m = len(self.tests)
        if self.xy_m.ndim != 2 or self.xy_m.shape[1] != 2 or len(self.xy_m) != m:
            raise InputDataError(f"density layer needs (m, 2) places and (m,) tests, got {self.xy_m.shape}, ({m},)")
        if m == 0:
            raise InputDataError("the density layer has no tiles in the region")
        if not (np.isfinite(self.xy_m).all() and np.isfinite(self.tests).all() and (self.tests >= 0).all()):
            raise InputDataError("the density layer's places and tests must be finite, tests >= 0")
        if self.speed is not None and (self.speed.shape != (m,) or not (np.isfinite(self.speed).all())):
            raise InputDataError("the density layer's speeds must be (m,) finite values")

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (e.g. to Dask workers) without the summed-area tables, which are rebuilt on use."""
        return {name: value for name, value in self.__dict__.items() if name != "_grid"}

    @classmethod
    def from_tiles(
        cls, tiles: pd.DataFrame, projection: ProjectedTransform, *, radii_m: tuple[float, ...] = DENSITY_RADII_M,
        speed_radii_m: tuple[float, ...] = SPEED_RADII_M,
    ) -> TestDensityCovariates:
        """From Ookla tiles (columns ``quadkey``, ``tests``, and ``avg_d_kbps`` and ``service``
        when present), one row per (tile, quarter) or per tile, projected with the model's
        ``projection``. Without ``avg_d_kbps`` the layer has density columns only."""
        missing = {"quadkey", "tests"} - set(tiles.columns)
        if missing:
            raise InputDataError(f"density tiles lack columns {sorted(missing)}")
        tests = tiles["tests"].to_numpy(np.float64)
        frame = pd.DataFrame({"quadkey": tiles["quadkey"].astype(str).to_numpy(), "tests": tests})
        if "avg_d_kbps" in tiles.columns:
            mbps = tiles["avg_d_kbps"].to_numpy(np.float64) / 1000.0
            known = np.isfinite(mbps) & (mbps >= 0)
            frame["weight"] = np.where(known, tests, 0.0)
            frame["weighted"] = tests * np.log1p(np.where(known, mbps, 0.0))
        per_tile = frame.groupby("quadkey", sort=True).sum()
        xy_m = projection.to_metres(quadkey_centres(per_tile.index.to_numpy(dtype=object)))
        speed = None
        if "weight" in per_tile and per_tile["weight"].sum() > 0:
            weight, weighted = per_tile["weight"].to_numpy(), per_tile["weighted"].to_numpy()
            overall = weighted.sum() / weight.sum()  # a tile without a known speed: the layer's mean
            speed = np.where(weight > 0, weighted / np.maximum(weight, 1e-12), overall)
        services = sorted(set(tiles["service"].astype(str))) if "service" in tiles.columns else []
        return cls(xy_m, per_tile["tests"].to_numpy(np.float64), speed, tuple(radii_m), tuple(speed_radii_m),
                   ",".join(services) or "tiles")

    @property
    def names(self) -> tuple[str, ...]:
        """Column names, e.g. ``fixed_tests_1km``, ``fixed_speed_3km``."""
        density = tuple(f"{self.source}_tests_{r / 1000:g}km" for r in self.radii_m)
        speed = () if self.speed is None else tuple(f"{self.source}_speed_{r / 1000:g}km" for r in self.speed_radii_m)
        return density + speed

    @property
    def overall_speed(self) -> float:
        """The layer's test-weighted mean ln(1 + Mbps): the speed column where a window holds no test."""
        assert self.speed is not None
        return float(np.sum(self.tests * self.speed) / max(float(self.tests.sum()), 1e-12))

    @cached_property
    def _grid(self) -> tuple[np.ndarray, float, list[np.ndarray]]:
        """(origin (2,) metres, cell side metres, summed-area tables (nx + 1, ny + 1) of the
        tests and, with a speed, of tests x speed)."""
        pad = max(self.radii_m + (self.speed_radii_m if self.speed is not None else ())) + CELL_M
        lo, hi = self.xy_m.min(axis=0) - pad, self.xy_m.max(axis=0) + pad
        cell = max(CELL_M, float(np.sqrt(np.prod(hi - lo) / MAX_CELLS)))
        shape = np.ceil((hi - lo) / cell).astype(int)
        index = np.floor((self.xy_m - lo) / cell).astype(int)
        tables = []
        for weights in [self.tests] + ([] if self.speed is None else [self.tests * self.speed]):
            counts = np.zeros(shape, dtype=np.float64)
            np.add.at(counts, (index[:, 0], index[:, 1]), weights)
            table = np.zeros((shape[0] + 1, shape[1] + 1), dtype=np.float64)
            table[1:, 1:] = counts.cumsum(axis=0).cumsum(axis=1)
            tables.append(table)
        return lo, cell, tables

    def _window_sums(self, xy_m: np.ndarray, radius_m: float, which: int) -> np.ndarray:
        """(n,) sums of table ``which`` over the square of half-side ``radius_m`` around each of
        ``xy_m`` (n, 2) metres: four lookups a point."""
        origin, cell, tables = self._grid
        table = tables[which]
        limit = np.array(table.shape) - 1
        first = np.clip(np.floor((xy_m - radius_m - origin) / cell).astype(np.int64) + 1, 0, limit)
        stop = np.clip(np.floor((xy_m + radius_m - origin) / cell).astype(np.int64) + 1, 0, limit)
        total = table[stop[:, 0], stop[:, 1]] - table[first[:, 0], stop[:, 1]]
        total -= table[stop[:, 0], first[:, 1]] - table[first[:, 0], first[:, 1]]
        return np.maximum(total, 0.0)  # cumulative sums of large counts can round a hair below 0

    def window_tests(self, xy_m: np.ndarray, radius_m: float) -> np.ndarray:
        """(n,) tests in the square of half-side ``radius_m`` around each of ``xy_m`` (n, 2) metres."""
        return self._window_sums(np.asarray(xy_m, dtype=np.float64).reshape(-1, 2), radius_m, 0)

    def window_speed(self, xy_m: np.ndarray, radius_m: float) -> np.ndarray:
        """(n,) test-weighted mean ln(1 + Mbps) of the tiles in each window (as
        :meth:`window_tests`), :attr:`overall_speed` where the window holds no test."""
        xy_m = np.asarray(xy_m, dtype=np.float64).reshape(-1, 2)
        tests, weighted = self._window_sums(xy_m, radius_m, 0), self._window_sums(xy_m, radius_m, 1)
        return np.where(tests > 0, weighted / np.maximum(tests, 1e-12), self.overall_speed)

    def columns(self, xy_m: np.ndarray) -> np.ndarray:
        """(n, k) covariates at ``xy_m`` (n, 2) metres, in :attr:`names` order: log(1 + T_r) / 5 - 1
        for each density window, then mean ln(1 + Mbps) - 4 for each speed window."""
        xy_m = np.asarray(xy_m, dtype=np.float64).reshape(-1, 2)
        columns = [np.log1p(self.window_tests(xy_m, r)) / 5.0 - 1.0 for r in self.radii_m]
        if self.speed is not None:
            columns += [self.window_speed(xy_m, r) - 4.0 for r in self.speed_radii_m]
        return np.column_stack(columns)

    def to_dict(self) -> dict[str, Any]:
        """Torch-saveable dict (weights-only readable)."""
        import torch  # here, not at the top: the CLI builds its parsers from this layer without torch

        return {
            "xy_m": torch.tensor(np.array(self.xy_m)),
            "tests": torch.tensor(np.array(self.tests)),
            "speed": None if self.speed is None else torch.tensor(np.array(self.speed)),
            "radii_m": list(self.radii_m),
            "speed_radii_m": list(self.speed_radii_m),
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TestDensityCovariates:
        speed = d.get("speed")
        return cls(
            d["xy_m"].cpu().numpy().astype(np.float64),
            d["tests"].cpu().numpy().astype(np.float64),
            None if speed is None else speed.cpu().numpy().astype(np.float64),
            tuple(float(r) for r in d["radii_m"]),
            tuple(float(r) for r in d.get("speed_radii_m", SPEED_RADII_M)),
            str(d["source"]),
        )


#: What names a density layer: tiles in a frame, or files / URLs of them.
DensitySource: TypeAlias = pd.DataFrame | str | Path | Sequence[str | Path]


def read_density_tiles(
    source: DensitySource, region: Region, *, buffer_deg: float = DEFAULT_BUFFER_DEG
) -> pd.DataFrame:
    """The density layer's tiles in ``region`` (grown by ``buffer_deg`` degrees): a frame as
    given, or files and URLs streamed by :func:`geodbk.ingest.scan.scan_tiles` (every quarter;
    the files must hold one service). ``"fixed:2023Q4"`` names Ookla's global fixed-broadband
    file of that quarter, downloaded once into the cache."""
    if isinstance(source, pd.DataFrame):
        return source
    return scan_tiles(source, region, buffer_deg=buffer_deg)


def sample_density_tiles(dataset: SpatialDataset) -> pd.DataFrame:
    """The shipped fixed-broadband tiles of a sample dataset's region (Puerto Rico or Hawaii),
    clipped as the dataset was: the density layer of the demo and the benchmarks."""
    fixed = sample_tiles_path(dataset.region, "fixed")
    return read_density_tiles(fixed, dataset.region, buffer_deg=dataset.buffer_deg)
