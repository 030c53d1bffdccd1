"""The end-to-end job behind ``geodbk demo``: dataset -> fits -> metrics -> maps -> run folder.

:func:`run_demo` builds the Puerto Rico (or Hawaii) mobile dataset from the shipped sample,
fits each requested model kind, prints the urban/rural metrics table and writes the run
folder that the dashboard reads (layout in :class:`RunFolder` and docs/architecture.md).
The defaults are sized to finish in a few minutes on 2 CPU cores (h = 64, r = 128 and the
CPU preset :data:`geodbk.models.config.CPU` of ``geodbk fit``); ``paper_size=True``
switches to the paper's h = 256, r = 1024 and 400 epochs at lr 1e-3 (a GPU job). Explicit
``epochs`` / ``lr`` win over either schedule.

The demo and ``geodbk fit`` write a run folder one way (:meth:`RunFolder.check_fits` before
training, :meth:`RunFolder.commit_fits` after): every file is staged in a hidden folder inside
the run folder (:class:`geodbk.fileio.FolderCommit`), and the models, the merged metrics, the
dataset and (the demo's) maps change together under the folder's lock, so a crash midway
leaves the previous files (or, for a new folder, nothing), never a half run; two fits into one
folder keep both models' rows. A commit replaces only the files it writes: earlier models, their
metrics rows and a user's files stay. ``fit`` adds models to a run folder; the demo writes a new
one, and into a folder that holds anything only with ``overwrite``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import suppress
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
    check_output,
    folder_lock,
    holdings,
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
        """Add fitted ``models`` with their test metrics ``results`` (:func:`evaluate_on_test` per
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
        the metrics rows of models fitted earlier are kept (those of ``results``' kinds replaced),
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
            staged = RunFolder(commit.staging)
            if not (self.dataset.exists() or staged.dataset.exists()):
                dataset.save(staged.dataset, geometry_from=geometry_from)
            save_metrics(table, staged.root)
            if output_kind(self.root) != RUN_FOLDER:
                mark_output(staged.root, RUN_FOLDER)
            commit.commit()
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

    ``out_dir`` must be missing or empty unless ``overwrite``; with it, the demo's files
    replace theirs and whatever else the folder holds stays (earlier models keep their
    metrics rows, as after ``geodbk fit``). The files are staged in a hidden folder inside
    ``out_dir`` and committed together when all are written (:meth:`RunFolder.commit_fits`); on
    any failure the staging folder is removed, and so is ``out_dir`` if the demo made it.

    Raises:
        InputDataError: no model kinds, or a split that leaves too little to validate or test on
            (:meth:`geodbk.dataset.spatial_dataset.SpatialDataset.check_split`, before any fit).
        OutputExistsError: ``out_dir`` holds anything (unless ``overwrite``), is a file or a
            device, or holds a dataset of another region or target (before any fit;
            :meth:`RunFolder.check_fits`).
    """
    cfg = config or DemoConfig()
    if not cfg.models:
        raise InputDataError("no model kinds to fit")
    final = RunFolder(Path(out_dir))
    final.check_folder(overwrite=overwrite, demo=True)  # before the dataset is built and minutes of fitting
    made = not final.root.exists()
    commit = FolderCommit(final.root, overwrite=overwrite)
    try:
        return _run_demo_into(commit, final, cfg, echo, overwrite=overwrite)
    except BaseException:
        commit.discard()
        if made:
            with suppress(OSError):  # empty, unless something was put there meanwhile
                final.root.rmdir()
        raise


def _run_demo_into(
    commit: FolderCommit, final: RunFolder, cfg: DemoConfig, echo: Callable[[str], None], *, overwrite: bool
) -> DemoResult:
    """The body of :func:`run_demo`: write every file into ``commit``'s staging folder, naming
    them by their place in ``final``, and commit them; the result refers to ``final``."""
    run = RunFolder(commit.staging)
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
    final.check_fits(dataset, cfg.models, overwrite=overwrite, demo=True)
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

    echo("test-split metrics (y = log10 " + f"{dataset.target} in {dataset.units}):")
    echo(format_metrics_table(metrics_table(results)))
    if (note := dataset.test_note()) is not None:
        echo(note)

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
    table = final.commit_fits(commit, dataset, results, overwrite=overwrite, demo=True)
    for path in (run.metrics_csv, run.metrics_json):
        wrote(path)
    return DemoResult(final, dataset, models, table, refs, files, seconds)


__all__ = ["DEMO_MODELS", "DemoConfig", "DemoResult", "RunFolder", "evaluate_on_test", "run_demo"]
