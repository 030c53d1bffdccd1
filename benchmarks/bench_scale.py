"""Scale benchmark: seconds per training epoch on a 5-million-row space-time tile set, and a
10^8-cell grid streamed to Zarr with peak RSS under 2 GB.

Three parts, all measured in one run:

Data
    ``--rows`` (tile, quarter) rows over the 20 quarters 2019Q1-2023Q4, generated with numpy one
    quarter at a time into preallocated arrays. First a population of distinct zoom-16 tiles
    (located at tile centres, as Ookla's are) is drawn inside a square box of ``--box-deg``
    degrees (8 degrees at 36N: 720 x 890 km, about the area of Texas): 80% from a mixture of
    Gaussian "cities" (60 of them, sizes 1.5-20 km, weights growing with size) and 20% from a
    uniform rural background. Each quarter then has a row for the same number of tiles, drawn
    from that population without replacement with log-normal activity weights, so that tiles
    recur across quarters (about 9 of the 20, as in the real sample). The target is a log10
    download speed in Mbps: a base level, up to +0.4 in cities, a smooth random field (sd 0.25,
    wavelengths 20-400 km), a persistent offset per tile (sd 0.15), a trend of +0.7 over the 19
    quarter steps (the shipped Puerto Rico sample goes from 1.12 to 1.88), and noise of variance
    0.1^2 + 0.6^2 / tests. Test counts are drawn with replacement from the ``tests`` column of the
    shipped Puerto Rico sample (read with :func:`geodbk.ingest.ookla.read_tiles`), independently
    of place; the data table compares the two sets.
Training
    The model inputs are built the way :func:`geodbk.fit.fitting.fit_dataset` builds them for the
    space-time protocol, from public pieces: an :class:`~geodbk.dataset.inputs.InputSpace` with a
    :class:`~geodbk.dataset.coords.ProjectedTransform` fitted to the distinct tile centres and a
    :class:`~geodbk.dataset.inputs.TimeAxis` over the training quarters, the rows split 8:1:1 by
    :func:`geodbk.dataset.splits.random_split`, targets standardised on the train rows, and
    the space-time :class:`~geodbk.dataset.protocols.Protocol`'s configs for those inputs
    (:func:`~geodbk.fit.protocol.fit_configs`: encoding wavelength, coordinate jitter).
    dbk-rbf of the ``--preset`` size (cpu: h = 64, r = 128, batch 1024) is then trained with
    :class:`geodbk.fit.step.TrainingStep` and :func:`geodbk.fit.step.train_epoch`, the loop of
    :func:`geodbk.fit.train.fit_arrays`. Setup
    (tensors on the device, model, optimizer) is timed apart from the epochs; each epoch is
    timed as its training pass and its validation pass (the predictive NLL of the val rows that
    fit_arrays computes after every epoch). With ``--max-steps`` only that many steps of each
    epoch run (on a random permutation of all train rows, through the same TrainingStep) and the
    epoch time is extrapolated from them; the output says so. ``--device auto`` trains on the CPU
    and, when CUDA is present, again on CUDA (with CUDA graphs, as fit_arrays does there).
Grid
    The trained model (as initialised with ``--grid-only``: prediction costs the same whatever
    the weights) is wrapped as a :class:`~geodbk.fit.geomodel.GeoModel`, saved, and loaded by a
    fresh subprocess, so the RSS reported is that of gridding alone, not of a parent holding the
    training set. The subprocess streams a square ``--cells`` grid (10,000 x 10,000) over the box,
    every cell inside the region, to a Zarr store with :func:`geodbk.maps.predict.predict_grid`
    (default layers: mean, sd, 95% interval, p_below; default row blocks).

Memory is the kernel's resident-set high-water mark (VmHWM, Linux ``/proc``), reset through
``/proc/self/clear_refs`` at the start of a phase so that the peak belongs to that phase; on
CUDA also ``torch.cuda.max_memory_allocated``. The 2 GB check is on the grid process's peak
over its whole life (imports, model, warm-up and streaming), against 2.0e9 bytes.

    OMP_NUM_THREADS=1 python benchmarks/bench_scale.py --rows 200000 --cells 1000000 --max-steps 50
    python benchmarks/bench_scale.py                      # 5M rows, 2 epochs, 10^8 cells
    python benchmarks/bench_scale.py --train-only --device cuda --preset paper
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import shapely
import torch
from affine import Affine

from geodbk import paths
from geodbk.dataset.coords import ProjectedTransform
from geodbk.dataset.inputs import InputSpace, TimeAxis
from geodbk.dataset.protocols import ENCODING_SCALES, MIN_WAVELENGTH_M, SPACE_TIME
from geodbk.dataset.splits import random_split
from geodbk.errors import ExtrapolationWarning
from geodbk.fit.geomodel import GeoModel
from geodbk.fit.protocol import fit_configs
from geodbk.fit.regressor import Regressor, build_model
from geodbk.fit.step import TrainingStep, train_epoch
from geodbk.fit.train import make_optimizer, mean_nll
from geodbk.ingest.ookla import read_tiles
from geodbk.ingest.quadkey import OOKLA_ZOOM, lonlat_to_tile, quadkey_to_tile, tile_bounds
from geodbk.maps.geometry import WGS84, RegularGrid
from geodbk.maps.predict import predict_grid
from geodbk.models import ModelConfig, get_model_spec
from geodbk.models.config import PRESETS, TrainConfig
from geodbk.models.expansions import deferred_cholesky_checks
from geodbk.quarters import quarter_years

KIND = "dbk-rbf"
QUARTERS = [(year, quarter) for year in range(2019, 2024) for quarter in range(1, 5)]
LABELS = [f"{year}Q{quarter}" for year, quarter in QUARTERS]
KM_PER_DEG = 111.32
#: The 2 GB bound of the grid check, bytes, and the same in MiB (the unit of every table).
RSS_LIMIT_BYTES = 2.0e9
RSS_LIMIT_MIB = RSS_LIMIT_BYTES / 2**20
FULL_ROWS = 5_000_000
FULL_CELLS = 100_000_000


# --- memory and time ---------------------------------------------------------------------
def _status_mib(key: str) -> float:
    """A ``kB`` line of /proc/self/status (``VmRSS``, ``VmHWM``) in MiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"/proc/self/status has no {key}")


def rss_mib() -> float:
    """Resident set size of this process now, MiB."""
    return _status_mib("VmRSS")


def peak_rss_mib() -> float:
    """Highest resident set size since the last :func:`reset_peak_rss` (or process start), MiB."""
    return _status_mib("VmHWM")


def reset_peak_rss() -> None:
    """Set the kernel's RSS high-water mark back to the current RSS."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    """``(fn(), seconds)``, with CUDA synchronised before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    value = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return value, time.perf_counter() - start


# --- the synthetic data set -------------------------------------------------------------
@dataclass(frozen=True)
class Box:
    """A square lon/lat box, ``side`` degrees, centred on ``(lon, lat)``."""

    lon: float
    lat: float
    side: float

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        half = self.side / 2.0
        return self.lon - half, self.lat - half, self.lon + half, self.lat + half

    def km(self, lon: np.ndarray, lat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Equirectangular kilometres east and north of the centre."""
        return (lon - self.lon) * KM_PER_DEG * math.cos(math.radians(self.lat)), (lat - self.lat) * KM_PER_DEG

    def zoom16_tiles(self) -> int:
        """How many zoom-16 tiles the box holds, roughly."""
        west, south, east, north = self.bounds
        (x0, x1), (y1, y0) = lonlat_to_tile(np.array([west, east]), np.array([south, north]))
        return int((x1 - x0 + 1) * (y1 - y0 + 1))


class SpeedSurface:
    """The synthetic world: where tiles are (cities + rural background) and their noise-free log10 Mbps.

    Args:
        box: the region.
        rng: draws the cities and the random field once.
    """

    N_CITIES = 60
    RURAL_SHARE = 0.2
    BASE = 0.85  # log10 Mbps of the countryside in 2019Q1 (10^0.85 = 7.1 Mbps)
    CITY_BOOST = 0.4
    FIELD_SD = 0.25
    FIELD_WAVES = 32
    TREND = 0.7  # log10 gain over the 19 quarter steps 2019Q1 -> 2023Q4: 10^0.7 = 5x

    def __init__(self, box: Box, rng: np.random.Generator) -> None:
        self.box = box
        west, south, east, north = box.bounds
        inset = 0.05 * box.side
        self.city_lon = rng.uniform(west + inset, east - inset, self.N_CITIES)
        self.city_lat = rng.uniform(south + inset, north - inset, self.N_CITIES)
        self.city_km = np.exp(rng.uniform(np.log(1.5), np.log(20.0), self.N_CITIES))
        weight = self.city_km**2 * rng.lognormal(0.0, 0.7, self.N_CITIES)
        self.city_weight = weight / weight.sum()
        wavelength_km = np.exp(rng.uniform(np.log(20.0), np.log(400.0), self.FIELD_WAVES))
        angle = rng.uniform(0.0, 2.0 * np.pi, self.FIELD_WAVES)
        self.wave_x, self.wave_y = np.cos(angle) / wavelength_km, np.sin(angle) / wavelength_km
        self.wave_phase = rng.uniform(0.0, 2.0 * np.pi, self.FIELD_WAVES)

    def draw_points(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` lon/lat points from the mixture, inside the box."""
        west, south, east, north = self.box.bounds
        rural = rng.random(n) < self.RURAL_SHARE
        city = rng.choice(self.N_CITIES, size=n, p=self.city_weight)
        spread_km = self.city_km[city] * rng.standard_normal((2, n))
        lat = self.city_lat[city] + spread_km[1] / KM_PER_DEG
        lon = self.city_lon[city] + spread_km[0] / (KM_PER_DEG * np.cos(np.radians(lat)))
        lon[rural], lat[rural] = rng.uniform(west, east, rural.sum()), rng.uniform(south, north, rural.sum())
        keep = (lon > west) & (lon < east) & (lat > south) & (lat < north)
        return lon[keep], lat[keep]

    def urban(self, lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
        """How urban each point is, in [0, 1]: 1 - prod_k (1 - g_k), g_k a Gaussian bump twice city k's size."""
        x, y = self.box.km(lon, lat)
        rural = np.ones_like(x)
        for city_x, city_y, size in zip(*self.box.km(self.city_lon, self.city_lat), self.city_km, strict=True):
            rural *= 1.0 - np.exp(-((x - city_x) ** 2 + (y - city_y) ** 2) / (8.0 * size**2))
        return 1.0 - rural

    def __call__(self, lon: np.ndarray, lat: np.ndarray, period: int) -> np.ndarray:
        """Noise-free log10 Mbps at ``lon``, ``lat`` in quarter ``period`` (0 = 2019Q1)."""
        x, y = self.box.km(lon, lat)
        field = np.zeros_like(x)
        for wave_x, wave_y, phase in zip(self.wave_x, self.wave_y, self.wave_phase, strict=True):
            field += np.cos(2.0 * np.pi * (x * wave_x + y * wave_y) + phase)
        field *= self.FIELD_SD * math.sqrt(2.0 / self.FIELD_WAVES)
        return self.BASE + self.CITY_BOOST * self.urban(lon, lat) + field + self.TREND * period / (len(QUARTERS) - 1)


@dataclass
class TileRows:
    """One row per (tile, quarter): tile centre, zoom-16 tile id, quarter, tests and log10 Mbps."""

    lon: np.ndarray
    lat: np.ndarray
    tile: np.ndarray  # x * 2**16 + y at zoom 16
    period: np.ndarray  # index into QUARTERS
    tests: np.ndarray
    y: np.ndarray

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.lon, self.lat, self.tile, self.period, self.tests, self.y))

    def years(self) -> np.ndarray:
        """Decimal years of the rows' quarters."""
        year, quarter = np.array(QUARTERS).T
        return quarter_years(year, quarter)[self.period]


#: Share of the tile population that has a row in a quarter (shipped PR sample: 7.4k of 16.2k).
COVERAGE = 0.45
#: sd of a tile's persistent offset; sd of a row's noise is sqrt(NOISE_TILE^2 + NOISE_TEST^2 / tests).
TILE_SD, NOISE_TILE, NOISE_TEST = 0.15, 0.1, 0.6


def distinct_tiles(surface: SpeedSurface, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` distinct zoom-16 tile ids (x * 2**16 + y) drawn from the surface's density."""
    ids = np.empty(0, dtype=np.int64)
    while len(ids) < n:
        lon, lat = surface.draw_points(2 * (n - len(ids)) + 1024, rng)
        x, y = lonlat_to_tile(lon, lat, OOKLA_ZOOM)
        ids = np.unique(np.concatenate([ids, (x << OOKLA_ZOOM) | y]))
    return rng.choice(ids, size=n, replace=False)


def generate(rows: int, surface: SpeedSurface, pr_tests: np.ndarray, seed: int) -> TileRows:
    """``rows`` rows, one quarter at a time, each quarter a weighted draw of distinct tiles from one
    population (so tiles recur across quarters, the active ones more often)."""
    per_quarter = rows // len(QUARTERS)
    population = math.ceil(per_quarter / COVERAGE)
    if rows < len(QUARTERS) or population > surface.box.zoom16_tiles() // 3:
        raise SystemExit(f"--rows {rows:,}: the tile population ({population:,}) must lie between 1 and a third "
                         f"of the box's {surface.box.zoom16_tiles():,} tiles; change --rows or --box-deg")
    rng = np.random.default_rng(seed)
    tiles = distinct_tiles(surface, population, rng)
    activity = rng.standard_normal(population)  # log of how often a tile reports
    offset = TILE_SD * rng.standard_normal(population)
    data = TileRows(np.empty(rows), np.empty(rows), np.empty(rows, np.int64), np.empty(rows, np.int8),
                    np.empty(rows, np.int32), np.empty(rows))
    start = 0
    for period in range(len(QUARTERS)):
        n = per_quarter + (period < rows % len(QUARTERS))
        part = slice(start, start + n)
        chosen = np.argpartition(activity + rng.gumbel(size=population), population - n)[population - n :]
        ids = tiles[chosen]  # Gumbel top-n: n tiles without replacement, with probabilities exp(activity)
        bounds = tile_bounds(ids >> OOKLA_ZOOM, ids & ((1 << OOKLA_ZOOM) - 1), OOKLA_ZOOM)
        lon, lat = (bounds[:, 0] + bounds[:, 2]) / 2.0, (bounds[:, 1] + bounds[:, 3]) / 2.0
        tests = rng.choice(pr_tests, size=n)
        noise_sd = np.sqrt(NOISE_TILE**2 + NOISE_TEST**2 / tests)
        data.lon[part], data.lat[part], data.tile[part], data.period[part] = lon, lat, ids, period
        data.tests[part] = tests
        data.y[part] = surface(lon, lat, period) + offset[chosen] + noise_sd * rng.standard_normal(n)
        start += n
    return data


def occupied_neighbours(tile: np.ndarray, period: np.ndarray, sample: int = 100_000) -> float:
    """Mean number of a row's 8 adjacent zoom-16 tiles that have a row in the same quarter (a
    sample of rows): clustering at the tile scale, whatever the size of the region."""
    keys = np.sort((period.astype(np.int64) << (2 * OOKLA_ZOOM)) | tile)
    picked = keys[np.random.default_rng(0).choice(len(keys), min(sample, len(keys)), replace=False)]
    found = 0
    for dx in (-1, 0, 1):
        for dy in (-1, 0, 1):
            if dx or dy:
                probe = picked + (dx << OOKLA_ZOOM) + dy
                at = np.searchsorted(keys, probe).clip(max=len(keys) - 1)
                found += int((keys[at] == probe).sum())
    return found / len(picked)


# --- model inputs and training ----------------------------------------------------------
@dataclass
class Inputs:
    """What the training step sees: input space, standardised targets, tests, per split."""

    space: InputSpace
    X: dict[str, np.ndarray]
    y: dict[str, np.ndarray]
    tests: dict[str, np.ndarray]
    y_mean: float
    y_std: float


def build_inputs(data: TileRows, dtype: torch.dtype, seed: int, chunk: int = 1 << 19) -> Inputs:
    """The space-time inputs of :func:`geodbk.fit.fitting.fit_dataset`, built in chunks of rows."""
    _, first = np.unique(data.tile, return_index=True)
    coords = ProjectedTransform.from_lonlat(np.column_stack([data.lon[first], data.lat[first]]))
    labels = random_split(len(data.y), seed)
    years = data.years()
    train_years = years[labels == "train"]
    space = InputSpace(coords, TimeAxis(float(train_years.min()), float(train_years.max())), "space-time")
    np_dtype = torch.empty((), dtype=dtype).numpy().dtype
    X = np.empty((len(data.y), 3), dtype=np_dtype)
    for start in range(0, len(X), chunk):
        rows = slice(start, start + chunk)
        X[rows] = space.features(np.column_stack([data.lon[rows], data.lat[rows]]), years[rows])
    train = labels == "train"
    y_mean, y_std = float(data.y[train].mean()), float(data.y[train].std())
    y = ((data.y - y_mean) / y_std).astype(np_dtype)
    tests = data.tests.astype(np_dtype)
    masks = {split: labels == split for split in ("train", "val")}
    return Inputs(space, {s: X[m] for s, m in masks.items()}, {s: y[m] for s, m in masks.items()},
                  {s: tests[m] for s, m in masks.items()}, y_mean, y_std)


def partial_epoch(step: TrainingStep, batch: int, steps: int, generator: torch.Generator) -> tuple[float, float, float]:
    """``steps`` training steps on the head of a random permutation of all rows, as train_epoch
    runs them; returns (mean loss, seconds for the place noise and the permutation, seconds for the
    steps)."""
    device = step.X.device
    with deferred_cholesky_checks(step.model) as guards:
        step.model.train()
        step.loss_sum.zero_()
        for guard in guards:
            guard.failures.zero_()
        def draw() -> torch.Tensor:  # as train_epoch: the epoch's place noise, then the batch order
            step.draw_place_noise(generator)
            return torch.randperm(step.n, generator=generator).to(device)

        order, permutation_s = timed(draw, device)
        head = order[: steps * batch]
        _, steps_s = timed(lambda: step.run(head, batch), device)
        failures = sum(int(guard.failures) for guard in guards)
    if failures:
        print(f"  note: {failures} Cholesky failure(s) in the timed steps; train_epoch would redo the epoch")
    return float(step.loss_sum) / len(head), permutation_s, steps_s


@dataclass
class EpochTime:
    """One timed epoch: its training pass (extrapolated when fewer steps ran) and validation pass."""

    train_s: float
    val_s: float
    loss: float
    val_nll: float
    measured_steps: int


@dataclass
class TrainRun:
    """The training measurement on one device; RSS in MiB over the whole run, setup included."""

    device: str
    setup_s: float
    rows: int
    steps_per_epoch: int
    epochs: list[EpochTime]
    start_rss: float
    peak_rss: float
    cuda_peak_mib: float | None
    regressor: Regressor


def train(device: torch.device, inputs: Inputs, config: ModelConfig, tc: TrainConfig, epochs: int,
          max_steps: int | None) -> TrainRun:
    """Setup, then ``epochs`` timed epochs of dbk-rbf on ``device``."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start_rss = rss_mib()
    reset_peak_rss()

    def on_device(split: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """X, standardised y and tests of a split (shared with numpy on the CPU, copied to CUDA)."""
        X, y, tests = (torch.as_tensor(part[split], device=device) for part in (inputs.X, inputs.y, inputs.tests))
        return X, y, tests

    def setup() -> tuple[TrainingStep, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        train_rows, val_rows = on_device("train"), on_device("val")
        torch.manual_seed(tc.seed)
        model = build_model(KIND, 3, config).to(device)
        objective = get_model_spec(KIND).objective
        assert objective is not None  # dbk-rbf is trained by a loss, not fitted in closed form
        step = TrainingStep(
            model, objective(tc), make_optimizer(model, tc), *train_rows, coordinate_jitter=tc.coordinate_jitter
        )
        return step, val_rows

    (step, (X_val, y_val, tests_val)), setup_s = timed(setup, device)
    generator = torch.Generator().manual_seed(tc.seed)
    steps_per_epoch = math.ceil(step.n / tc.batch_size)
    timed_steps = min(max_steps or steps_per_epoch, steps_per_epoch)
    extrapolated = timed_steps < steps_per_epoch
    times = []
    for epoch in range(1, epochs + 1):
        if extrapolated:
            loss, permutation_s, steps_s = partial_epoch(step, tc.batch_size, timed_steps, generator)
            train_s = permutation_s + steps_s * steps_per_epoch / timed_steps
        else:
            loss, train_s = timed(partial(train_epoch, step, tc, False, generator, kind=KIND, epoch=epoch), device)
        val_nll, val_s = timed(lambda: mean_nll(step.model, X_val, y_val, tc.eval_batch_size, tests_val), device)
        times.append(EpochTime(train_s, val_s, loss, val_nll, timed_steps))
        print(f"  {device.type} epoch {epoch}: {train_s:.1f} s train{' (extrapolated)' if extrapolated else ''}, "
              f"{val_s:.1f} s validation", flush=True)
    cuda_peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    peak = peak_rss_mib()
    step.model.eval()
    history = [{"epoch": i + 1, "loss": t.loss, "val_nll": t.val_nll} for i, t in enumerate(times)]
    regressor = Regressor(kind=KIND, model=step.model, model_config=config, input_dim=3, y_mean=inputs.y_mean,
                          y_std=inputs.y_std, history=history, best_epoch=len(times), train_config=tc.to_dict())
    return TrainRun(device.type, setup_s, step.n, steps_per_epoch, times, start_rss, peak, cuda_peak, regressor)


def untrained(inputs: Inputs, config: ModelConfig, tc: TrainConfig) -> Regressor:
    """dbk-rbf as initialised, for ``--grid-only`` (prediction costs the same whatever the weights)."""
    torch.manual_seed(tc.seed)
    model = build_model(KIND, 3, config).eval()
    return Regressor(kind=KIND, model=model, model_config=config, input_dim=3, y_mean=inputs.y_mean,
                     y_std=inputs.y_std, train_config=tc.to_dict())


# --- the grid, in its own process -------------------------------------------------------
def grid_worker(model_path: str, store: str, cells: int, device: str) -> dict[str, Any]:
    """Stream a square grid of about ``cells`` cells over the model's box to ``store``; measurements."""
    model = GeoModel.load(model_path, device)
    region = model.fitted_region()
    west, south, east, north = region.geometry.bounds
    side = math.isqrt(cells)

    def square(n: int) -> RegularGrid:
        res = (east - west) / n
        return RegularGrid(WGS84, Affine(res, 0.0, west, 0.0, -res, north), n, n, region.geometry, region.name)

    grid = square(side)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ExtrapolationWarning)
        # warm-up: lazy imports (zarr, dask) and first allocations belong to the baseline
        predict_grid(model, square(64), store=str(Path(store).with_name("warm-up.zarr")), progress=False)
        baseline = rss_mib()
        setup_peak = peak_rss_mib()
        reset_peak_rss()
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        ds = predict_grid(model, grid, store=store, progress=True)
        seconds = time.perf_counter() - start
    stream_peak = peak_rss_mib()
    rows_per_block = grid.default_chunk_rows()
    first_block = ds["mean"].isel(y=slice(0, rows_per_block)).values
    return {
        "side": side,
        "cells": side * side,
        "resolution_deg": grid.resolution,
        "layers": len(ds.data_vars),
        "rows_per_block": rows_per_block,
        "blocks": -(-side // rows_per_block),
        "seconds": seconds,
        "baseline_mib": baseline,
        "setup_peak_mib": setup_peak,
        "stream_peak_mib": stream_peak,
        "process_peak_mib": max(setup_peak, stream_peak),
        "cuda_peak_mib": torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None,
        "store_mib": sum(f.stat().st_size for f in Path(store).rglob("*") if f.is_file()) / 2**20,
        "first_block_finite": float(np.isfinite(first_block).mean()),
        "extrapolation": [str(w.message) for w in caught if issubclass(w.category, ExtrapolationWarning)][:1],
    }


def run_grid(geomodel: GeoModel, args: argparse.Namespace) -> dict[str, Any]:
    """Save ``geomodel`` and run :func:`grid_worker` in a fresh interpreter (its progress bar shows here)."""
    raw_bytes = args.cells * 7 * 4  # 7 float32 layers
    with tempfile.TemporaryDirectory(dir=args.store_dir, prefix="bench_scale_") as tmp:
        free = shutil.disk_usage(tmp).free
        if free < 1.2 * raw_bytes:
            raise SystemExit(f"{tmp} has {free / 2**30:.1f} GiB free; the store may need up to "
                             f"{raw_bytes / 2**30:.1f} GiB (7 float32 layers); give --store-dir")
        model_path = str(Path(tmp) / "model.pt")
        geomodel.save(model_path)
        cmd = [sys.executable, __file__, "--grid-worker", model_path, str(Path(tmp) / "grid.zarr"),
               "--cells", str(args.cells), "--threads", str(args.threads), "--grid-device", args.grid_device]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the grid process failed (exit {done.returncode})")
        return json.loads(done.stdout.strip().splitlines()[-1])


# --- tables -------------------------------------------------------------------------------
def print_settings(args: argparse.Namespace, devices: list[torch.device], box: Box) -> None:
    names = [torch.cuda.get_device_name(d) if d.type == "cuda" else "cpu" for d in devices]
    preset = PRESETS[args.preset]
    print("settings")
    rows = [
        ("rows", f"{args.rows:,} (tile, quarter) rows, {len(QUARTERS)} quarters {LABELS[0]}-{LABELS[-1]}, "
                 f"seed {args.seed}"),
        ("box", f"{args.box_deg:g} x {args.box_deg:g} deg centred on ({box.lon:g}, {box.lat:g}), "
                f"~{box.zoom16_tiles():,} zoom-16 tiles"),
        ("model", f"{KIND}, preset {preset.name} (h = {preset.hidden}, r = {preset.rank}, batch {preset.batch_size}, "
                  f"lr {preset.lr:g}), {args.dtype}; inputs (u, v, t), {ENCODING_SCALES}-scale encoding from "
                  f"{MIN_WAVELENGTH_M:g} m, test-count noise"),
        ("training", "skipped (--grid-only)" if args.grid_only else
         f"{args.epochs} epoch(s) on {', '.join(names)}"
         + (f"; {args.max_steps} steps timed per epoch, the rest extrapolated" if args.max_steps else "")),
        ("grid", "skipped (--train-only)" if args.train_only else
         f"{math.isqrt(args.cells)}^2 = {math.isqrt(args.cells) ** 2:,} cells to Zarr on {args.grid_device}, "
         "own process"),
        ("torch", f"{torch.__version__}; {torch.get_num_threads()} thread(s) "
                  f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}); "
                  f"{os.cpu_count()} logical CPUs, load average {os.getloadavg()[0]:.2f} at start"),
    ]
    for key, value in rows:
        print(f"  {key:10s} {value}")


def print_data(data: TileRows, pr: Any, generate_s: float, generate_peak: float, inputs_s: float,
               inputs: Inputs) -> None:
    """The generated set next to the shipped Puerto Rico sample."""
    pr_x, pr_y_tile, _ = quadkey_to_tile(pr["quadkey"].to_numpy())
    pr_tests = pr["tests"].to_numpy(np.float64)
    pr_set = (np.log10(pr["avg_d_kbps"].to_numpy(np.float64) / 1000.0),
              (pr["year"].to_numpy() - 2019) * 4 + pr["quarter"].to_numpy() - 1,
              (pr_x << OOKLA_ZOOM) | pr_y_tile, pr_tests)

    def stats(y: np.ndarray, period: np.ndarray, tile: np.ndarray, tests: np.ndarray) -> list[str]:
        quarters = np.unique(period)
        q = np.percentile(tests, [50, 90, 99])
        sd = np.mean([y[period == p].std() for p in quarters])
        return [f"{len(y):,}", f"{len(y) / len(quarters):,.0f}", f"{len(y) / len(np.unique(tile)):.1f}",
                f"{occupied_neighbours(tile, period):.1f}", f"{q[0]:.0f} / {q[1]:.0f} / {q[2]:.0f}",
                f"{tests.mean():.1f}", f"{y[period == 0].mean():.2f} -> {y[period == len(QUARTERS) - 1].mean():.2f}",
                f"{sd:.2f}"]

    print(f"\ndata: generated in {generate_s:.1f} s, arrays {data.nbytes / 2**20:,.0f} MiB, peak RSS "
          f"+{generate_peak:,.0f} MiB while generating; model inputs built in {inputs_s:.1f} s "
          f"(train {len(inputs.y['train']):,} / val {len(inputs.y['val']):,} rows, X {inputs.X['train'].dtype})")
    head = ["rows", "rows/qtr", "qtrs/tile", "nbrs/8", "tests p50/p90/p99", "tests mean", "log10 Mbps Q1 -> Q20",
            "sd/qtr"]
    widths = [11, 9, 9, 6, 17, 10, 20, 6]
    print("  " + " ".join(f"{h:>{w}s}" for h, w in zip(head, widths, strict=True)) + "  set")
    for cols, name in [(stats(data.y, data.period, data.tile, data.tests.astype(np.float64)), "synthetic"),
                       (stats(*pr_set), "shipped PR sample, 19 quarters")]:
        print("  " + " ".join(f"{c:>{w}s}" for c, w in zip(cols, widths, strict=True)) + f"  {name}")
    log_tests = np.log(pr_tests)
    print("  qtrs/tile: rows per distinct tile; nbrs/8: occupied adjacent tiles in the same quarter (clustering); "
          "sd/qtr: sd of log10 Mbps within a quarter")
    print(f"  tests are resampled from the PR sample's {len(pr_tests):,} counts; a log-normal fit to them has "
          f"mu {log_tests.mean():.2f}, sigma {log_tests.std():.2f} (natural log)")


def print_training(runs: list[TrainRun], rows: int) -> None:
    print("\ntraining (per epoch: training pass + validation pass)")
    head = (f"  {'device':6s} {'epoch':>5s} {'steps':>11s} {'train s':>8s} {'val s':>6s} {'epoch s':>8s} "
            f"{'train rows/s':>12s} {'loss':>7s} {'val NLL':>7s}")
    print(head)
    for run in runs:
        for i, t in enumerate(run.epochs, 1):
            steps = f"{t.measured_steps}/{run.steps_per_epoch}"
            print(f"  {run.device:6s} {i:5d} {steps:>11s} {t.train_s:8.1f} {t.val_s:6.1f} {t.train_s + t.val_s:8.1f} "
                  f"{run.rows / t.train_s:12,.0f} {t.loss:7.3f} {t.val_nll:7.3f}")
    print("  steps: timed / per epoch (fewer timed: the epoch is extrapolated); val NLL on the standardised scale")
    print(f"\n  {'device':6s} {'setup s':>7s} {'s/epoch':>8s} {'start RSS':>9s} {'peak RSS':>9s} {'+RSS':>6s} "
          f"{'CUDA peak':>9s}   (MiB; s/epoch = last epoch, training + validation)")
    for run in runs:
        last = run.epochs[-1]
        cuda = f"{run.cuda_peak_mib:9,.0f}" if run.cuda_peak_mib is not None else f"{'-':>9s}"
        print(f"  {run.device:6s} {run.setup_s:7.1f} {last.train_s + last.val_s:8.1f} {run.start_rss:9,.0f} "
              f"{run.peak_rss:9,.0f} {run.peak_rss - run.start_rss:6,.0f} {cuda}")
    by_device = {run.device: run.epochs[-1].train_s + run.epochs[-1].val_s for run in runs}
    if len(by_device) == 2:
        print(f"  ratio cpu / cuda s/epoch: {by_device['cpu'] / by_device['cuda']:.1f}")
    if any(t.measured_steps < run.steps_per_epoch for run in runs for t in run.epochs):
        print("  EXTRAPOLATED, not measured: the training passes ran only the timed steps; their time shown is "
              "permutation + timed steps' time x (steps per epoch / timed steps)")
    if rows < FULL_ROWS:
        for run in runs:
            last = run.epochs[-1]
            scaled = (last.train_s + last.val_s) * FULL_ROWS / rows
            print(f"  EXTRAPOLATED, not measured: {run.device} at {FULL_ROWS:,} rows ~ {scaled:,.0f} s/epoch "
                  f"(x {FULL_ROWS / rows:g} rows)")


def print_grid(result: dict[str, Any]) -> None:
    print(f"\ngrid: {result['side']:,} x {result['side']:,} = {result['cells']:,} cells (all inside the box), "
          f"{result['resolution_deg']:.5f} deg cells, {result['layers']} float32 layers, "
          f"{result['blocks']} row block(s) of {result['rows_per_block']} rows, streamed to Zarr by a fresh process")
    print(f"  {'seconds':>8s} {'cells/s':>10s} {'baseline':>8s} {'stream peak':>11s} {'process peak':>12s} "
          f"{'store':>7s}   (MiB)")
    print(f"  {result['seconds']:8.1f} {result['cells'] / result['seconds']:10,.0f} {result['baseline_mib']:8,.0f} "
          f"{result['stream_peak_mib']:11,.0f} {result['process_peak_mib']:12,.0f} {result['store_mib']:7,.0f}")
    print("  baseline: RSS after imports, model and a 64 x 64 warm-up grid; stream peak: RSS high-water mark "
          "while streaming; process peak: over the process's life")
    if result["cuda_peak_mib"] is not None:
        print(f"  CUDA max_memory_allocated while streaming: {result['cuda_peak_mib']:,.0f} MiB")
    print(f"  read back: {100 * result['first_block_finite']:.1f}% of the first block's mean values are finite")
    if result["extrapolation"]:
        print(f"  ExtrapolationWarning: {result['extrapolation'][0]}")
    if result["cells"] < FULL_CELLS:
        print(f"  EXTRAPOLATED, not measured: {FULL_CELLS:,} cells ~ "
              f"{result['seconds'] * FULL_CELLS / result['cells']:,.0f} s at the measured cells/s")
    verdict = "PASS" if result["process_peak_mib"] < RSS_LIMIT_MIB else "FAIL"
    scope = "" if result["cells"] >= FULL_CELLS else f" (the claim is for {FULL_CELLS:,}: run without --cells)"
    print(f"\n2 GB check: grid process peak RSS {result['process_peak_mib']:,.0f} MiB vs {RSS_LIMIT_MIB:,.0f} MiB "
          f"(2.0e9 bytes) at {result['cells']:,} cells: {verdict}{scope}")


# --- main ---------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=FULL_ROWS, help="generated (tile, quarter) rows (5,000,000)")
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per device (2: the first holds "
                        "CUDA-graph capture)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="auto: the CPU, and CUDA too when present")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu", help="model size and batch (cpu)")
    parser.add_argument("--max-steps", type=int, help="time only this many steps of each epoch and extrapolate")
    parser.add_argument("--cells", type=int, default=FULL_CELLS, help="grid cells, rounded down to a square (1e8)")
    parser.add_argument("--grid-device", choices=["cpu", "cuda"], default="cpu", help="where the grid is predicted")
    parser.add_argument("--grid-only", action="store_true", help="skip the training measurement")
    parser.add_argument("--train-only", action="store_true", help="skip the grid measurement")
    parser.add_argument("--box-deg", type=float, default=8.0, help="side of the square region, degrees (8)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch CPU threads (default: torch's, which follows OMP_NUM_THREADS)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--store-dir", help="folder for the temporary Zarr store (default: the system temp)")
    parser.add_argument("--grid-worker", nargs=2, metavar=("MODEL", "STORE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    if args.grid_worker:
        model_path, store = args.grid_worker
        print(json.dumps(grid_worker(model_path, store, args.cells, args.grid_device)))
        return
    if args.grid_only and args.train_only:
        parser.error("--grid-only and --train-only exclude each other")
    if args.epochs < 1 or (args.max_steps is not None and args.max_steps < 1):
        parser.error("--epochs and --max-steps must be positive")
    if args.cells < 1:
        parser.error("--cells must be positive")
    cuda = torch.cuda.is_available()
    if "cuda" in (args.device, args.grid_device) and not cuda:
        parser.error("CUDA asked for but torch sees no CUDA device")
    devices = [torch.device("cpu")] * (args.device != "cuda") + [torch.device("cuda")] * (args.device != "cpu" and cuda)
    box = Box(-96.0, 36.0, args.box_deg)
    print_settings(args, devices, box)
    host = torch.device("cpu")

    pr = read_tiles(paths.PUERTO_RICO_MOBILE)
    surface = SpeedSurface(box, np.random.default_rng(args.seed))
    start_rss = rss_mib()
    reset_peak_rss()
    data, generate_s = timed(lambda: generate(args.rows, surface, pr["tests"].to_numpy(np.int32), args.seed + 1),
                             host)
    generate_peak = peak_rss_mib() - start_rss
    dtype = ModelConfig(dtype=args.dtype).torch_dtype
    inputs, inputs_s = timed(lambda: build_inputs(data, dtype, args.seed), host)
    print_data(data, pr, generate_s, generate_peak, inputs_s, inputs)

    preset = PRESETS[args.preset]
    config, tc = fit_configs(SPACE_TIME, inputs.space, preset.name, dtype=args.dtype, progress=False)  # as fit_dataset
    if args.grid_only:
        regressor = untrained(inputs, config, tc)
    else:
        print("\ntraining ...", flush=True)
        runs = [train(device, inputs, config, tc, args.epochs, args.max_steps) for device in devices]
        print_training(runs, args.rows)
        regressor = runs[-1].regressor
    if args.train_only:
        return

    west, south, east, north = box.bounds
    meta = {"kind": KIND, "target": "download", "units": "Mbps", "service": "mobile", "region": "synthetic box",
            "region_wkb_hex": shapely.to_wkb(shapely.box(west, south, east, north), hex=True),
            "quarters": LABELS, "protocol": "space-time", "split": "random",
            "n_train": len(inputs.y["train"]), "local_residuals": False}
    print(f"\ngrid ({'the model as initialised' if args.grid_only else 'the model just trained'}) ...", flush=True)
    print_grid(run_grid(GeoModel(regressor, inputs.space, meta), args))


if __name__ == "__main__":
    main()
