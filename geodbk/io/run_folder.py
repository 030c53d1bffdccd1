"""The run folder: where ``geodbk fit`` and ``geodbk demo`` keep a dataset, its fitted models,
their metrics and maps, and how both write it as one transaction.

Every file is staged in a hidden folder inside the run folder
(:class:`geodbk.fileio.FolderCommit`): the models, the merged metrics, the dataset and the maps
change together under the folder's lock, so a crash midway leaves the previous files (or, for a
new folder, nothing), never a half run; two fits into one folder keep both models' rows. A commit
replaces only the files it writes: earlier models, their metrics rows and a user's files stay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from geodbk.dataset.spatial_dataset import SpatialDataset
from geodbk.errors import InputDataError, OutputExistsError
from geodbk.fileio import RUN_FOLDER, FolderCommit, check_output, folder_lock, holdings, mark_output, output_kind
from geodbk.fit.geomodel import GeoModel
from geodbk.fit.metrics import metrics_columns, metrics_table, save_metrics

#: Seconds a fit waits for another process to finish writing the same run folder.
RUN_LOCK_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RunFolder:
    """Paths inside a run folder (``<run>/dataset.parquet``, ``models/``, ``maps/``, metrics)."""

    root: Path

    @property
    def dataset(self) -> Path:
        return self.root / "dataset.parquet"

    @property
    def metrics_csv(self) -> Path:
        return self.root / "metrics.csv"

    @property
    def metrics_json(self) -> Path:
        return self.root / "metrics.json"

    def model(self, kind: str) -> Path:
        """``<run>/models/<kind>.pt``: a saved :class:`geodbk.fit.geomodel.GeoModel`."""
        return self.root / "models" / f"{kind}.pt"

    def map_netcdf(self, kind: str) -> Path:
        """``<run>/maps/<kind>.nc``: the grid dataset of :func:`geodbk.maps.predict.predict_grid`."""
        return self.root / "maps" / f"{kind}.nc"

    def map_geotiff(self, kind: str) -> Path:
        """``<run>/maps/<kind>.tif``: the same grid, one GeoTIFF band per variable."""
        return self.root / "maps" / f"{kind}.tif"

    def test_tiles(self, kind: str) -> Path:
        """``<run>/maps/<kind>_test_tiles.geojson``: test tiles with the model's predictions."""
        return self.root / "maps" / f"{kind}_test_tiles.geojson"

    def hexagons(self, kind: str) -> Path:
        """``<run>/decisions/<kind>_h3.parquet``: a two-target model's H3 hexagon summary
        (:func:`geodbk.decisions.hexagon_summary.summarize_hexagons`, :attr:`DemoConfig.h3_resolution`)."""
        return self.root / "decisions" / f"{kind}_h3.parquet"

    def plan(self, kind: str) -> Path:
        """``<run>/decisions/<kind>_plan.parquet``: where its next :attr:`DemoConfig.plan_budget` visits settle
        the most (:func:`geodbk.decisions.visits.plan_hexagon_visits`)."""
        return self.root / "decisions" / f"{kind}_plan.parquet"

    def looks_like_run(self) -> bool:
        """Whether :attr:`root` is missing, an empty folder, a run folder geodbk marked, or holds
        only run-folder entries (``dataset.parquet``, ``metrics.*``, ``models/``, ``maps/``,
        hidden files; a run folder of a geodbk without markers): where ``geodbk fit`` may add
        models."""
        if not self.root.exists():
            return True
        if not self.root.is_dir():
            return False
        if output_kind(self.root) == RUN_FOLDER:
            return True
        known = {self.dataset.name, self.metrics_csv.name, self.metrics_json.name, "models", "maps", "decisions"}
        return all(entry.name in known or entry.name.startswith(".") for entry in self.root.iterdir())

    def outputs(self, kinds: Sequence[str], *, maps: bool = False) -> list[Path]:
        """The files a fit of ``kinds`` writes here: the dataset, both metrics files and the
        models, and with ``maps`` (the demo) each kind's maps, test tiles and decisions."""
        paths = [self.dataset, self.metrics_csv, self.metrics_json, *(self.model(k) for k in kinds)]
        if maps:
            paths += [path for k in kinds for path in (
                self.map_netcdf(k), self.map_geotiff(k), self.test_tiles(k), self.hexagons(k), self.plan(k))]
        return paths

    def check_folder(self, *, overwrite: bool = False, demo: bool = False) -> None:
        """Raise unless a fit (or with ``demo``, the demo) may write into this folder.

        Raises:
            OutputExistsError: the folder is a file, FIFO or device (always); or, unless
                ``overwrite``, for a fit it holds files other than a run folder's
                (:meth:`looks_like_run`), and for the demo it holds anything but geodbk's own
                bookkeeping (:func:`geodbk.fileio.holdings`).
            OutputPathError: a parent of the folder is a file or not writable, or its name is not UTF-8.
        """
        check_output(self.root, kind=RUN_FOLDER, overwrite=True, name="--out")  # its name, type and parents
        if self.root.exists() and not self.root.is_dir():
            raise OutputExistsError(f"--out {self.root} is a file, not a run folder; choose another --out")
        if overwrite or not self.root.is_dir():
            return
        if not demo:
            if not self.looks_like_run():
                raise OutputExistsError(f"--out {self.root} holds files other than a run folder's; pass --overwrite "
                                        "to add the run to it anyway")
            return
        held = holdings(self.root)
        if held and self.looks_like_run():
            raise OutputExistsError(f"--out {self.root} holds a run already; pass --overwrite to write this run's "
                                    "files over its own (its other models and files are kept), or choose another "
                                    "--out")
        if held:
            raise OutputExistsError(f"--out {self.root} exists and is not a run folder: it holds {held[0].name}"
                                    f"{' and more' if len(held) > 1 else ''}; pass --overwrite to add the run's "
                                    "files to it (the files there are kept), or choose another --out")

    def check_fits(
        self, dataset: SpatialDataset, kinds: Sequence[str], *, overwrite: bool = False, demo: bool = False
    ) -> None:
        """Raise unless fitting ``kinds`` on ``dataset`` may be saved here (run it before training);
        ``demo``: the demo's run, which writes its own dataset and maps and a new folder
        (:meth:`check_folder`).

        Raises:
            OutputExistsError: the folder may not be written (:meth:`check_folder`), or (unless
                ``overwrite``) one of the files written (:meth:`outputs`) is a folder, or (always)
                one is a FIFO or a device, or the folder's dataset is of another region or target.
            OutputPathError: a parent of the folder is a file or not writable.
            InputDataError: the folder's dataset or metrics table cannot be read.
        """
        self.check_folder(overwrite=overwrite, demo=demo)
        for path in self.outputs(kinds, maps=demo):
            check_output(path, overwrite=overwrite)
        if self.dataset.is_file():
            held = SpatialDataset.load(self.dataset)
            if (held.region.name, held.region.code, held.target) != (
                dataset.region.name, dataset.region.code, dataset.target
            ):
                raise OutputExistsError(
                    f"{self.root} holds a {held.target} dataset of {held.region.name}, not {dataset.target} of "
                    f"{dataset.region.name}; write into another run folder"
                )
        self._earlier_metrics()

    def _earlier_metrics(self) -> pd.DataFrame | None:
        """The metrics table of models fitted earlier into this run folder, if it has one."""
        if not self.metrics_csv.is_file():
            return None
        try:
            table = pd.read_csv(self.metrics_csv)
        except (ValueError, UnicodeDecodeError) as err:  # pandas' parser and empty-file errors are ValueErrors
            raise InputDataError(f"cannot read {self.metrics_csv}: {err}") from None
        if "model" not in table.columns:
            raise InputDataError(f"{self.metrics_csv} is not a geodbk metrics table (no 'model' column)")
        return table

    def save_fits(
        self,
        dataset: SpatialDataset,
        models: dict[str, GeoModel],
        results: dict[str, pd.DataFrame],
        *,
        overwrite: bool = False,
        timeout_s: float | None = None,
        geometry_from: str | Path | None = None,
    ) -> pd.DataFrame:
        """Add fitted ``models`` with their test metrics ``results`` (:func:`evaluate_targets` per
        kind) to the run folder and return the merged metrics table: the models are staged in a
        :class:`geodbk.fileio.FolderCommit` and committed by :meth:`commit_fits`."""
        commit = FolderCommit(self.root, overwrite=overwrite)
        try:
            staged = RunFolder(commit.staging)
            for kind, model in models.items():
                model.save(staged.model(kind))
            return self.commit_fits(commit, dataset, results, overwrite=overwrite, timeout_s=timeout_s,
                                    geometry_from=geometry_from)
        finally:
            commit.discard()

    def commit_fits(
        self,
        commit: FolderCommit,
        dataset: SpatialDataset,
        results: dict[str, pd.DataFrame],
        *,
        overwrite: bool = False,
        demo: bool = False,
        timeout_s: float | None = None,
        geometry_from: str | Path | None = None,
    ) -> pd.DataFrame:
        """Commit the files staged in ``commit`` (a :class:`geodbk.fileio.FolderCommit` of this
        folder holding the models of ``results``' kinds, and the demo's dataset and maps) with the
        merged metrics table, and return that table. ``geometry_from``: the file a dataset loaded
        without its polygons came from (:meth:`SpatialDataset.save`).

        Under the folder's lock (waiting up to ``timeout_s``, default :data:`RUN_LOCK_TIMEOUT_S`,
        then :class:`geodbk.errors.FolderBusyError`), the checks of :meth:`check_fits` run again,
        the metrics rows of models fitted earlier are kept (those of ``results``' kinds replaced;
        rows written before metrics had a ``target`` column are the dataset's target's),
        ``dataset`` is staged too when neither the folder nor the staging has one, and every
        staged file, both metrics files and the folder's marker are moved into place together;
        files of the folder that were not staged stay as they are.
        """
        with folder_lock(self.root, timeout_s=RUN_LOCK_TIMEOUT_S if timeout_s is None else timeout_s):
            self.check_fits(dataset, list(results), overwrite=overwrite, demo=demo)
            table = metrics_table(results)
            earlier = self._earlier_metrics()
            if earlier is not None:
                table = pd.concat([earlier[~earlier["model"].isin(list(results))], table], ignore_index=True)
                if "target" in table:  # rows written before metrics had a target column are the dataset's target's
                    table["target"] = table["target"].fillna(dataset.target)
                table = table[metrics_columns(table)]
            staged = RunFolder(commit.staging)
            if not (self.dataset.exists() or staged.dataset.exists()):
                dataset.save(staged.dataset, geometry_from=geometry_from)
            save_metrics(table, staged.root)
            if output_kind(self.root) != RUN_FOLDER:
                mark_output(staged.root, RUN_FOLDER)
            commit.commit()
        return table
