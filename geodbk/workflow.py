"""The end-to-end job behind ``geodbk demo``: dataset -> fits -> metrics -> maps -> run folder.

:func:`run_demo` builds the Puerto Rico (or Hawaii) mobile dataset from the shipped sample,
fits each requested model kind, prints the urban/rural metrics table and writes the run
folder that the dashboard reads (layout in :class:`RunFolder` and docs/architecture.md).
The defaults are sized to finish in a few minutes on 2 CPU cores (h = 64, r = 128 and the
CPU preset :data:`geodbk.models.config.CPU` of ``geodbk fit``); ``paper_size=True``
switches to the paper's h = 256, r = 1024 and 400 epochs at lr 1e-3 (a GPU job). Explicit
``epochs`` / ``lr`` win over either schedule.

The demo and ``geodbk fit`` write a run folder one way (:meth:`RunFolder.check_fits` before
training, :meth:`RunFolder.commit_fits` after; :mod:`geodbk.io.run_folder`): ``fit`` adds
models to a run folder; the demo writes a new one, and into a folder that holds anything only
with ``overwrite``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from geodbk.dataset.density import sample_density_tiles
from geodbk.dataset.protocols import get_protocol
from geodbk.dataset.spatial_dataset import SpatialDataset, load_sample_dataset
from geodbk.decisions.hexagon_summary import summarize_hexagons
from geodbk.decisions.visits import plan_hexagon_visits
from geodbk.errors import InputDataError
from geodbk.fileio import (
    FolderCommit,
)
from geodbk.fit.fitting import fit_dataset
from geodbk.fit.geomodel import GeoModel
from geodbk.fit.metrics import baseline_note, evaluate, format_metrics_table, metrics_table
from geodbk.fit.protocol import configs
from geodbk.io.geotiff import write_geotiff
from geodbk.io.run_folder import RunFolder
from geodbk.io.vectors import write_tile_predictions
from geodbk.maps.reference import reference_points
from geodbk.maps.summaries import write_summary
from geodbk.maps.thresholds import DEFAULT
from geodbk.models.config import TrainConfig
from geodbk.quarters import Quarter

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


@dataclass
class DemoConfig:
    """Settings of :func:`run_demo`.

    Attributes:
        region: shipped sample region, ``"PR"`` (Puerto Rico) or ``"HI"`` (Hawaii), or counties
            of them (``"Kauai, HI"``, ``"15007"``, joined by ``+``; :func:`~geodbk.ingest.regions.load_region`).
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
    quarters: Sequence[Quarter | str] | None = None
    models: Sequence[str] = DEMO_MODELS
    pair_models: Sequence[str] = PAIR_MODELS
    h3_resolution: int = DEMO_H3_RESOLUTION
    plan_budget: int = DEMO_PLAN_BUDGET
    protocol: str = "space-time"
    split: str = "random"
    block_m: float | None = None
    map_quarter: Quarter | None = None
    change: tuple[Quarter, Quarter] | None = None
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
        return configs(get_protocol(self.protocol), self.preset, **self.overrides())[1]

    def density_tiles(self, dataset: SpatialDataset) -> pd.DataFrame | None:
        """The density layer this demo gives ``dataset``'s fits: the region's shipped
        fixed-broadband tiles with ``density`` under the space-time protocol, else ``None``."""
        return sample_density_tiles(dataset) if self.density and get_protocol(self.protocol).space_time else None


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


def evaluate_targets(model: GeoModel, dataset: SpatialDataset, split: str = "test") -> pd.DataFrame:
    """:func:`evaluate_on_test` of each of the model's targets that the dataset holds (download,
    and upload for a model of the pair), one frame with a ``target`` column: what a run folder's
    ``metrics.csv`` stores per model."""
    parts = [evaluate_on_test(model.for_target(target), dataset.for_target(target), split).assign(target=target)
             for target in model.targets if target in dataset.targets]
    return pd.concat(parts)


def metrics_heading(dataset: SpatialDataset) -> str:
    """``"test-split metrics (y = log10 download in Mbps):"``, the line above a metrics table."""
    return f"test-split metrics (y = log10 {' and '.join(dataset.targets)} in {dataset.units}):"


def pair_correlations(models: Mapping[str, GeoModel]) -> list[str]:
    """One printed line per model of a download,upload pair: the correlation of its two errors."""
    return [f"{kind}: error correlation of {' and '.join(model.targets)} {model.correlation.tile:.2f} (tiles)"
            for kind, model in models.items() if model.correlation is not None]


def metrics_notes(table: pd.DataFrame, dataset: SpatialDataset) -> list[str]:
    """The lines printed under a fit's test metrics ``table`` (a :func:`~geodbk.fit.metrics.metrics_table`):
    a model that the nearest-tiles average beats, few validation rows, a noisy test split."""
    notes = (baseline_note(table), dataset.validation_note(), dataset.test_note())
    return [note for note in notes if note is not None]


def run_demo(
    out_dir: str | Path,
    config: DemoConfig | None = None,
    *,
    echo: Callable[[str], None] = print,
    overwrite: bool = False,
) -> DemoResult:
    """Run the whole job and write the run folder ``out_dir``, atomically.

    Writes ``dataset.parquet``, ``models/<kind>.pt``, ``metrics.csv`` / ``metrics.json``
    (long table: model, target, group, n, MAE, NLL, CRPS, coverage95, pi_width on the test split)
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
        results[kind] = evaluate_targets(model, dataset)

    echo(metrics_heading(dataset))
    scores = metrics_table(results)
    echo(format_metrics_table(scores))
    for line in (*pair_correlations(models), *metrics_notes(scores, dataset)):
        echo(line)

    fitted = next(iter(models.values()))
    several = fitted.latest_quarter is not None and len(fitted.info.fitted_quarters) > 1
    quarters, change = cfg.map_quarter or ("all" if several else "latest"), cfg.change or (
        "last-year" if several else None)
    refs: dict[str, tuple[float, float]] = {}
    for kind, model in models.items():  # kernel-free kinds (knn, dnn) get no kernel slices or change layers
        t0 = time.perf_counter()
        map_plan = model.plan(
            cfg.resolution, dataset.region, quarters, change if model.has_kernel else None, crs=cfg.map_crs,
            threshold=cfg.threshold if cfg.threshold is not None else DEFAULT, max_distance=cfg.max_distance,
            store=run.map_netcdf(kind), progress=cfg.progress,
        )
        if not refs:  # one set for every kind's map, chosen on the first one's grid (all share it)
            refs = reference_points(dataset, map_plan.grid)
            echo("kernel slices (GP kinds) at " + ", ".join(f"{k} ({lon:.3f}, {lat:.3f})" for k, (lon, lat) in
                                                             refs.items()))
        map_plan = map_plan.with_refs(refs)
        echo(f"{kind} map {map_plan.describe()}")
        grid_ds = model.grid(map_plan)
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


__all__ = [
    "DEMO_MODELS", "DemoConfig", "DemoResult", "RunFolder", "evaluate_on_test", "evaluate_targets", "metrics_heading",
    "metrics_notes", "pair_correlations", "run_demo",
]
