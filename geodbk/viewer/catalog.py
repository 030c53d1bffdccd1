"""The run folders a viewer shows: which fitted models they hold, and the files of each.

A run folder is what ``geodbk demo`` writes (:class:`geodbk.workflow.RunFolder`): the
dataset, one saved :class:`geodbk.fit.geomodel.GeoModel` per model kind, the metrics table
and the prebuilt grids. Everything a :class:`Fit` reads goes through the cached readers of
:mod:`geodbk.viewer.loaders`, keyed by the file's modification time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import xarray as xr

from geodbk.dataset.spatial_dataset import SpatialDataset
from geodbk.errors import GeodbkError, InputDataError
from geodbk.fit.geomodel import GeoModel
from geodbk.quarters import Quarter
from geodbk.viewer import loaders
from geodbk.viewer.loaders import stamp
from geodbk.workflow import RunFolder


@dataclass(frozen=True)
class Fit:
    """One saved model in a run folder and the files that go with it.

    Attributes:
        run: the run folder.
        kind: model kind (the file stem of ``models/<kind>.pt``).
        target: what it predicts (``"download"``, ``"upload"`` or ``"latency"``).
    """

    run: Path
    kind: str
    target: str

    @property
    def label(self) -> str:
        """``"dbk-rbf (demo, download)"``: the model picker's text."""
        return f"{self.kind} ({self.run.name}, {self.target})"

    @property
    def files(self) -> RunFolder:
        return RunFolder(self.run)

    @property
    def model_path(self) -> Path:
        return self.files.model(self.kind)

    @property
    def grid_path(self) -> Path:
        return self.files.map_netcdf(self.kind)

    @property
    def geotiff_path(self) -> Path:
        return self.files.map_geotiff(self.kind)

    @property
    def test_tiles_path(self) -> Path:
        return self.files.test_tiles(self.kind)

    @property
    def dataset_path(self) -> Path:
        return self.files.dataset

    @property
    def hexagons_path(self) -> Path:
        return self.files.hexagons(self.kind)

    @property
    def plan_path(self) -> Path:
        return self.files.plan(self.kind)

    def model(self) -> GeoModel:
        return loaders.load_model(str(self.model_path), stamp(self.model_path))

    def grid(self) -> xr.Dataset | None:
        """The saved grid, or ``None`` when the run has none for this model."""
        if not self.grid_path.exists():
            return None
        return loaders.load_grid(str(self.grid_path), stamp(self.grid_path))

    def dataset(self) -> SpatialDataset:
        return loaders.load_dataset(str(self.dataset_path), stamp(self.dataset_path))

    def mercator_layer(self, variable: str, quarter: Quarter | None) -> xr.DataArray:
        """Grid ``variable`` at ``quarter`` warped to Web Mercator (see :mod:`geodbk.viewer.mercator`)."""
        return loaders.mercator_layer(str(self.grid_path), stamp(self.grid_path), variable, quarter)

    def prior_variance(self, quarter: Quarter | None) -> np.ndarray:
        """``(m,)`` prior variance k(x, x) at the grid cells inside the region (see
        :func:`geodbk.viewer.cells.grid_cells_lonlat`), (log10 units)²."""
        stamps = (stamp(self.model_path), stamp(self.grid_path))
        return loaders.prior_variance(str(self.model_path), str(self.grid_path), stamps, quarter)

    def posterior_correlation(self, ref: tuple[float, float], quarter: Quarter | None) -> np.ndarray:
        """``(m,)`` posterior correlation (first target) between the grid cells inside the region
        (see :func:`geodbk.viewer.cells.grid_cells_lonlat`) and ``ref`` (lon, lat) at ``quarter``."""
        stamps = (stamp(self.model_path), stamp(self.grid_path))
        ref = (float(ref[0]), float(ref[1]))
        return loaders.cells_posterior_correlation(str(self.model_path), str(self.grid_path), stamps, ref, quarter)

    def hexagons(self) -> gpd.GeoDataFrame | None:
        """The run's hexagon table of this model (download and upload), or ``None`` when it has none."""
        path = self.hexagons_path
        return loaders.load_hexagons(str(path), stamp(path)) if path.exists() else None

    def hexagon_columns(self) -> dict[str, object]:
        """The hexagon table's plot columns (:func:`geodbk.viewer.decisions.hexagon_columns`)."""
        return loaders.hexagon_plot_columns(str(self.hexagons_path), stamp(self.hexagons_path))

    def plan(self) -> gpd.GeoDataFrame | None:
        """The run's visit plan of this model, or ``None`` when it has none."""
        path = self.plan_path
        return loaders.load_plan(str(path), stamp(path)) if path.exists() else None

    def test_tiles(self) -> pd.DataFrame:
        """The run's test tiles with this model's predictions (:func:`geodbk.io.vectors.tile_predictions`)."""
        stamps = (stamp(self.model_path), stamp(self.dataset_path))
        return loaders.scored_test_tiles(str(self.model_path), str(self.dataset_path), stamps)

    def region_polygons(self, polygons: Path) -> gpd.GeoDataFrame:
        """The polygons of the file ``polygons`` that meet this run's region."""
        stamps = (stamp(polygons), stamp(self.dataset_path))
        return loaders.region_polygons(str(polygons), str(self.dataset_path), stamps)

    def polygon_summary(self, polygons: Path, quarter: Quarter | None) -> pd.DataFrame:
        """Area summary of this model over the region's polygons at ``quarter``."""
        stamps = (stamp(self.model_path), stamp(polygons), stamp(self.dataset_path))
        return loaders.polygon_summary(str(self.model_path), str(polygons), str(self.dataset_path), stamps, quarter)

    def default_reference(self) -> tuple[float, float]:
        """(lon, lat) degrees: the grid's first saved reference point (``urban`` when present),
        else a point inside the run's region."""
        grid = self.grid()
        if grid is not None and "ref_lon" in grid.coords:
            names = [str(n) for n in grid["ref"].to_numpy()]
            i = names.index("urban") if "urban" in names else 0
            return float(grid["ref_lon"][i]), float(grid["ref_lat"][i])
        centre = self.dataset().region.geometry.representative_point()
        return float(centre.x), float(centre.y)


def model_files(run: Path) -> list[Path]:
    """The saved models of run folder ``run`` (``<run>/models/*.pt``), sorted; none if it is not a folder."""
    pattern = RunFolder(run).model("*")
    return sorted(pattern.parent.glob(pattern.name)) if run.is_dir() else []


def check_run_folder(run: Path) -> None:
    """Refuse ``run`` unless the dashboard has something to show in it: a folder with a
    ``dataset.parquet``, saved models and the map of at least one of them (``maps/<kind>.nc``,
    which ``geodbk demo`` writes and ``geodbk fit`` does not).

    Raises:
        InputDataError: no such path, a file, not a run folder, or a run without maps; the
            message says what to run.
    """
    files = RunFolder(run)
    if not run.exists():
        raise InputDataError(f"no run folder at {run}; build one with `geodbk demo --out {run}`")
    if not run.is_dir():
        raise InputDataError(f"{run} is a file, not a run folder; give the folder `geodbk demo --out` wrote")
    models = model_files(run)
    if not files.dataset.is_file() or not models:
        raise InputDataError(f"{run} is not a run folder (no dataset.parquet or models/*.pt); "
                             f"build one with `geodbk demo --out {run}`")
    if not any(files.map_netcdf(path.stem).is_file() for path in models):
        kind = models[0].stem
        raise InputDataError(f"{run} has no maps to show (maps/<kind>.nc); make one with `geodbk predict --model "
                             f"{files.model(kind)} --out {files.map_netcdf(kind)}`")


@dataclass
class Catalog:
    """The fits found in the run folders, and why a folder or a model file was skipped."""

    fits: list[Fit] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @classmethod
    def scan(cls, runs: list[Path]) -> Catalog:
        """Every ``models/*.pt`` of each folder with a ``dataset.parquet``, in folder then name
        order; a folder without them, and a model file that does not load, become a line in
        :attr:`problems` (the other models stay)."""
        catalog = cls()
        for run in runs:
            files = RunFolder(run)
            models = model_files(run)
            if not files.dataset.exists() or not models:
                catalog.problems.append(f"`{run}` is not a run folder (no dataset.parquet or models/*.pt)")
                continue
            for path in models:
                try:
                    model = loaders.load_model(str(path), stamp(path))
                except (GeodbkError, OSError) as err:  # one bad file costs its own model only
                    catalog.problems.append(f"`{path}` is left out: {' '.join(str(err).split())}")
                    continue
                catalog.fits.append(Fit(run, path.stem, model.info.target))
        return catalog

    def for_target(self, target: str) -> list[Fit]:
        """The fits that predict ``target``."""
        return [fit for fit in self.fits if fit.target == target]

    @property
    def targets(self) -> list[str]:
        """The targets of the fits, sorted."""
        return sorted({fit.target for fit in self.fits})
