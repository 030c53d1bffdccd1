"""The end-to-end job behind ``geodbk demo``: dataset -> fits -> metrics -> maps -> run folder.

:func:`run_demo` builds the Puerto Rico (or Hawaii) mobile dataset from the shipped sample,
fits each requested model kind, prints the urban/rural metrics table and writes the run
folder that the dashboard reads (layout in :class:`RunFolder` and docs/architecture.md).
The defaults are sized to finish in a few minutes on 2 CPU cores (h = 64, r = 128 and the
CPU preset :data:`geodbk.models.config.CPU` of ``geodbk fit``); ``paper_size=True``
switches to the paper's h = 256, r = 1024 and 400 epochs at lr 1e-3 (a GPU job). Explicit
``epochs`` / ``lr`` win over either schedule.

A run folder appears whole or not at all: :func:`run_demo` fills a hidden temporary folder
beside the target and swaps it in when every file is written (:func:`geodbk.fileio.atomic_dir`),
so a crash midway leaves the previous run folder (or nothing) for the dashboard to open, never
a half run. The swap replaces the previous run folder as a whole, and only a folder that is
empty or a run folder geodbk wrote (its marker, :func:`geodbk.fileio.mark_output`), unless
``overwrite``.

``geodbk fit`` adds models to a run folder instead (:meth:`RunFolder.check_fits` before training,
:meth:`RunFolder.save_fits` after): the models, the merged metrics and the dataset (when new)
change together in one :class:`geodbk.fileio.FolderCommit`, under the folder's lock, so two
fits into one folder keep both models' rows and a killed fit leaves the old files.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from geodbk.dataset.density import sample_density_tiles
from geodbk.dataset.spatial_dataset import SpatialDataset, load_sample_dataset
from geodbk.decisions.hexagon_summary import summarize_hexagons
from geodbk.decisions.visits import plan_hexagon_visits
from geodbk.errors import InputDataError, OutputExistsError
from geodbk.fileio import (
    RUN_FOLDER,
    FolderCommit,
    atomic_dir,
    check_output,
    folder_lock,
    mark_output,
    output_kind,
)
from geodbk.fit.fitting import fit_dataset
from geodbk.fit.geomodel import GeoModel
from geodbk.fit.metrics import evaluate, format_metrics_table, metrics_table, save_metrics
from geodbk.fit.protocol import get_protocol
from geodbk.io.geotiff import write_geotiff
from geodbk.io.vectors import write_tile_predictions
from geodbk.maps.geometry import RegularGrid
from geodbk.maps.reference import reference_points
from geodbk.maps.summaries import write_summary
from geodbk.maps.thresholds import DEFAULT
from geodbk.models.config import TrainConfig

#: Model kinds the demo fits by default: the headline DBK, the SVGP baseline on the same deep
#: features and the k-nearest-tiles baseline every GP row has to beat (sv-rbf and the rest
#: of the zoo are in benchmarks/bench_quality.py and ``geodbk fit``).
DEMO_MODELS = ("dbk-rbf", "sv-dkl", "knn")
#: Kinds the demo fits on both download and upload (the headline; the others stay download-only
#: so that the demo keeps to its time).
PAIR_MODELS = ("dbk-rbf",)
#: H3 resolution of the demo's hexagon summary and plan (resolution 8: about 0.7 km^2, the
#: size of two zoom-16 tiles), and the visits its plan chooses.
DEMO_H3_RESOLUTION = 8
DEMO_PLAN_BUDGET = 25
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

    def check_fits(self, dataset: SpatialDataset, kinds: Sequence[str], *, overwrite: bool = False) -> None:
        """Raise unless fitting ``kinds`` on ``dataset`` may be saved here (run it before training).

        Raises:
            OutputExistsError: the folder holds files other than a run folder's
                (:meth:`looks_like_run`), or a model, metrics or dataset path is a folder (both
                unless ``overwrite``), or the folder's dataset is of another region or target
                (always).
            OutputPathError: the folder is a file, or a parent of it is a file or not writable.
            InputDataError: the folder's dataset or metrics table cannot be read.
        """
        if self.root.is_dir() and not (overwrite or self.looks_like_run()):
            raise OutputExistsError(f"--out {self.root} holds files other than a run folder's; pass --overwrite "
                                    "to add the run to it anyway")
        check_output(self.root, kind=RUN_FOLDER, overwrite=overwrite or self.root.is_dir(), name="--out")
        for path in (self.dataset, self.metrics_csv, self.metrics_json, *(self.model(k) for k in kinds)):
            check_output(path, overwrite=overwrite)
        if self.dataset.is_file():
            held = SpatialDataset.load(self.dataset)
            if (held.region.name, held.region.code, held.target) != (
                dataset.region.name, dataset.region.code, dataset.target
            ):
                raise OutputExistsError(
                    f"{self.root} holds a {held.target} dataset of {held.region.name}, not {dataset.target} of "
                    f"{dataset.region.name}; fit into another run folder"
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
        """Add fitted ``models`` with their test metrics ``results`` (:func:`evaluate_on_test` per
        kind) to the run folder and return the merged metrics table. ``geometry_from``: the file a
        dataset loaded without its polygons came from (:meth:`SpatialDataset.save`).

        Under the folder's lock (waiting up to ``timeout_s``, default :data:`RUN_LOCK_TIMEOUT_S`,
        then :class:`geodbk.errors.FolderBusyError`), the checks of :meth:`check_fits` run again,
        the metrics rows of models fitted earlier are kept (those of ``models``' kinds replaced),
        and the models, both metrics files, the dataset (when the folder has none) and the
        folder's marker are committed together (:class:`geodbk.fileio.FolderCommit`).
        """
        with folder_lock(self.root, timeout_s=RUN_LOCK_TIMEOUT_S if timeout_s is None else timeout_s):
            self.check_fits(dataset, list(models), overwrite=overwrite)
            table = metrics_table(results)
            earlier = self._earlier_metrics()
            if earlier is not None:
                table = pd.concat([earlier[~earlier["model"].isin(list(models))], table], ignore_index=True)
            commit = FolderCommit(self.root, overwrite=overwrite)
            try:
                staged = RunFolder(commit.staging)
                if not self.dataset.exists():
                    dataset.save(staged.dataset, geometry_from=geometry_from)
                for kind, model in models.items():
                    model.save(staged.model(kind))
                save_metrics(table, staged.root)
                if output_kind(self.root) != RUN_FOLDER:
                    mark_output(staged.root, RUN_FOLDER)
                commit.commit()
            finally:
                commit.discard()
        return table


@dataclass
class DemoConfig:
    """Settings of :func:`run_demo`.

    Attributes:
        region: shipped sample region, ``"PR"`` (Puerto Rico) or ``"HI"`` (Hawaii).
        target: ``"download,upload"`` (both speeds, the default), ``"download"`` / ``"upload"``
            (Mbps) or ``"latency"`` (ms).
        pair_models: the kinds fitted on every target of a two-target dataset (one model of both
            speeds, with ``p_meets`` maps); the other kinds model the first target only.
        h3_resolution: H3 resolution of such a model's hexagon summary and plan.
        plan_budget: visits in its plan.
        quarters: quarters like ``"2023Q4"``; ``None`` = all of 2019Q1-2023Q4.
        models: model kinds to fit (names of the model zoo).
        protocol: ``"space-time"`` (default) or the paper's ``"paper"`` (see
            :mod:`geodbk.dataset.inputs`).
        split: ``"random"``, ``"spatial-block"`` or ``"forecast"`` (see :mod:`geodbk.dataset.splits`).
        block_m: block side of the spatial-block split, metres; ``None`` chooses it from the tiles for
            ``seed`` (:func:`geodbk.dataset.splits.choose_block_m`).
        map_quarter: map only this quarter (2-D layers); default every fitted quarter along a
            CF ``time`` dimension (the dashboard's quarter slider).
        change: ``(from, to)`` quarters of the change layers (GP kinds); default the year to
            the latest fitted quarter (or the first fitted quarter, if that is later).
        threshold: speed benchmark of the ``p_below`` layer in data units; default the
            FCC's for the service and target (:mod:`geodbk.maps.thresholds`).
        max_distance: leave map cells farther than this many metres from a training tile empty.
        epochs: training epochs per model; ``None`` = the schedule's (CPU or paper).
        lr: AdamW learning rate; ``None`` = the schedule's.
        resolution: map cell side; degrees as a number, or ``"500m"`` style.
        map_crs: CRS of the maps (default EPSG:4326, or UTM for metre resolutions).
        paper_size: h = 256, r = 1024 and the 400-epoch schedule instead of the CPU sizes.
        density: give the models the region's shipped fixed-broadband tiles as a density
            layer (:mod:`geodbk.dataset.density`; space-time protocol only).
        seed: seed of the train/val/test split and of the model initialisation.
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        progress: show tqdm bars.
    """

    region: str = "PR"
    target: str = "download,upload"
    quarters: Sequence[str] | None = None
    models: Sequence[str] = DEMO_MODELS
    pair_models: Sequence[str] = PAIR_MODELS
    h3_resolution: int = DEMO_H3_RESOLUTION
    plan_budget: int = DEMO_PLAN_BUDGET
    protocol: str = "space-time"
    split: str = "random"
    block_m: float | None = None
    map_quarter: str | None = None
    change: tuple[str, str] | None = None
    threshold: float | None = None
    max_distance: float | None = None
    epochs: int | None = None
    lr: float | None = None
    resolution: float | str = 0.005
    map_crs: str | None = None
    paper_size: bool = False
    density: bool = True
    seed: int = 0
    device: str = "auto"
    progress: bool = True

    @property
    def preset(self) -> str:
        """The size and schedule preset: ``"paper"`` with ``paper_size``, else ``"cpu"``."""
        return "paper" if self.paper_size else "cpu"

    def overrides(self) -> dict[str, Any]:
        """What this demo sets over its protocol and preset: the keyword arguments of
        :func:`~geodbk.fit.fitting.fit_dataset` (``None`` = the preset's value)."""
        return {"epochs": self.epochs, "lr": self.lr, "seed": self.seed, "device": self.device,
                "progress": self.progress}

    def train_config(self) -> TrainConfig:
        """The schedule :func:`run_demo` trains with (the preset's; explicit ``epochs`` and ``lr`` win)."""
        return get_protocol(self.protocol).configs(self.preset, **self.overrides())[1]

    def density_tiles(self, dataset: SpatialDataset) -> pd.DataFrame | None:
        """The density layer this demo gives ``dataset``'s fits: the region's shipped
        fixed-broadband tiles with ``density`` under the space-time protocol, else ``None``."""
        return sample_density_tiles(dataset) if self.density and self.protocol == "space-time" else None


@dataclass
class DemoResult:
    """What :func:`run_demo` made: the folder, dataset, fitted models, metrics and files written."""

    run: RunFolder
    dataset: SpatialDataset
    models: dict[str, GeoModel]
    metrics: pd.DataFrame
    refs: dict[str, tuple[float, float]]
    files: list[Path] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


def evaluate_on_test(model: GeoModel, dataset: SpatialDataset, split: str = "test") -> pd.DataFrame:
    """:func:`geodbk.fit.metrics.evaluate` of ``model`` on a split of the dataset, by urban/rural.

    Each tile is scored at its own quarter against the distribution of a new measurement
    with its own number of tests.
    """
    rows = dataset.subset(split)
    prediction = model.predict_tiles(rows).measurement()
    return evaluate(rows["y"].to_numpy(np.float64), prediction, rows["urban_rural"].to_numpy().astype(str))


def _describe(quarters: str | Sequence[str] | None) -> str:
    if quarters is None:
        return "all pooled"
    if isinstance(quarters, str):
        return quarters
    return f"{quarters[0]}-{quarters[-1]} ({len(quarters)})"


def run_demo(
    out_dir: str | Path,
    config: DemoConfig | None = None,
    *,
    echo: Callable[[str], None] = print,
    overwrite: bool = False,
) -> DemoResult:
    """Run the whole job and write the run folder ``out_dir``, atomically.

    Writes ``dataset.parquet``, ``models/<kind>.pt``, ``metrics.csv`` / ``metrics.json``
    (long table: model, group, n, MAE, NLL, CRPS, coverage95, pi_width on the test split)
    and, per kind, ``maps/<kind>.nc`` (mean, sd, pi_width, data-unit bounds and kernel slices
    at an urban, a rural and a wildland reference point), ``maps/<kind>.tif`` and
    ``maps/<kind>_test_tiles.geojson``. ``echo`` receives the dataset summary, the metrics
    table and one line per file (named by its final path).

    The files are written into a hidden temporary folder beside ``out_dir`` that replaces
    ``out_dir`` as a whole when all are written; on any failure it is removed and ``out_dir``
    is left as it was.

    Raises:
        InputDataError: no model kinds, or a split that leaves too little to validate or test on
            (:meth:`geodbk.dataset.spatial_dataset.SpatialDataset.check_split`, before any fit).
        OutputExistsError: ``out_dir`` holds something other than an empty folder or a run
            folder geodbk wrote (which the swap would delete), unless ``overwrite``.
    """
    cfg = config or DemoConfig()
    if not cfg.models:
        raise InputDataError("no model kinds to fit")
    final = RunFolder(Path(out_dir))
    check_output(final.root, kind=RUN_FOLDER, overwrite=overwrite, name="--out")  # before minutes of fitting
    with atomic_dir(final.root, kind=RUN_FOLDER, overwrite=overwrite) as staging:
        result = _run_demo_into(RunFolder(staging), final, cfg, echo)
    return result


def _run_demo_into(run: RunFolder, final: RunFolder, cfg: DemoConfig, echo: Callable[[str], None]) -> DemoResult:
    """The body of :func:`run_demo`: write every file into ``run`` (the staging folder), naming
    them by their place in ``final``; the result refers to ``final``."""
    seconds: dict[str, float] = {}
    files: list[Path] = []

    def wrote(path: Path) -> None:
        files.append(final.root / path.relative_to(run.root))
        echo(f"wrote {files[-1]}")

    t0 = time.perf_counter()
    dataset = load_sample_dataset(
        cfg.region, cfg.target, quarters=list(cfg.quarters) if cfg.quarters else None, seed=cfg.seed, split=cfg.split,
        block_m=cfg.block_m,
    )
    dataset.check_split()
    echo(dataset.summary())
    dataset.save(run.dataset)
    wrote(run.dataset)
    seconds["dataset"] = time.perf_counter() - t0

    density = cfg.density_tiles(dataset)
    if density is not None:
        echo(f"density layer: {density['quadkey'].nunique():,} fixed-broadband tiles")
    models: dict[str, GeoModel] = {}
    results: dict[str, pd.DataFrame] = {}
    for kind in cfg.models:
        echo(f"fitting {kind} ...")
        t0 = time.perf_counter()
        model = fit_dataset(
            dataset, kind, targets=None if kind in cfg.pair_models else dataset.targets[:1], protocol=cfg.protocol,
            preset=cfg.preset, density_tiles=density, **cfg.overrides()
        )
        seconds[f"fit {kind}"] = time.perf_counter() - t0
        pair = f" ({' and '.join(model.targets)}; error correlation {model.correlation.tile:.2f})" if (
            model.correlation is not None) else ""
        echo(f"fitted {kind}{pair} in {seconds[f'fit {kind}']:.0f} s")
        model.save(run.model(kind))
        wrote(run.model(kind))
        models[kind] = model
        results[kind] = evaluate_on_test(model, dataset)

    table = metrics_table(results)
    echo("test-split metrics (y = log10 " + f"{dataset.target} in {dataset.units}):")
    echo(format_metrics_table(table))
    if (note := dataset.test_note()) is not None:
        echo(note)
    for path in save_metrics(table, run.root):
        wrote(path)

    grid = RegularGrid.over(dataset.region, cfg.resolution, crs=cfg.map_crs)
    refs = reference_points(dataset, grid)
    fitted = next(iter(models.values()))
    several = fitted.latest_quarter is not None and len(dataset.quarters) > 1
    quarters, change_spec = cfg.map_quarter or ("all" if several else "latest"), cfg.change or (
        "last-year" if several else None)
    mapped, change = fitted.map_time(quarters), fitted.change_span(change_spec)
    echo(f"map grid: {grid.height} x {grid.width} cells of {cfg.resolution} in {grid.crs.to_string()}, "
         f"quarters {_describe(mapped)}" + (f", change {change[0]} -> {change[1]}" if change else "")
         + "; kernel slices (GP kinds) at "
         + ", ".join(f"{k} ({lon:.3f}, {lat:.3f})" for k, (lon, lat) in refs.items()))
    for kind, model in models.items():  # kernel-free kinds (knn, dnn) get no kernel slices or change layers
        t0 = time.perf_counter()
        grid_ds = model.grid(
            cfg.resolution, dataset.region, quarters, change_spec if model.has_kernel else None,
            crs=cfg.map_crs, refs=refs if model.has_kernel else None,
            threshold=cfg.threshold if cfg.threshold is not None else DEFAULT,
            max_distance=cfg.max_distance, store=run.map_netcdf(kind), progress=cfg.progress,
        )
        wrote(run.map_netcdf(kind))
        latest = grid_ds.isel(time=[-1]) if "time" in grid_ds.dims else grid_ds
        wrote(write_geotiff(latest, run.map_geotiff(kind)))
        grid_ds.close()
        wrote(write_tile_predictions(model, dataset, run.test_tiles(kind)))
        seconds[f"maps {kind}"] = time.perf_counter() - t0
        if len(model.targets) == 2:  # download and upload: where each hexagon stands, and where to test next
            t0 = time.perf_counter()
            hexagons = summarize_hexagons(model, cfg.h3_resolution, progress=cfg.progress)
            wrote(write_summary(hexagons, run.hexagons(kind)))
            plan = plan_hexagon_visits(model, cfg.plan_budget, resolution=cfg.h3_resolution, progress=cfg.progress)
            wrote(write_summary(plan, run.plan(kind)))
            seconds[f"decisions {kind}"] = time.perf_counter() - t0
    return DemoResult(final, dataset, models, table, refs, files, seconds)


__all__ = ["DEMO_MODELS", "DemoConfig", "DemoResult", "RunFolder", "evaluate_on_test", "run_demo"]
