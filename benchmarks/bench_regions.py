"""Map quality on small regions cropped from the shipped samples: the table that the defaults
for a city or an island are chosen on.

Each region is a group of counties (Hawaii's islands one by one; municipio groups of Puerto
Rico), cut from the shipped mobile download sample with the Census 1:20M county boundaries, with
the region's shipped fixed-broadband tiles as every model's density layer. On each region, fit
dbk-rbf, the ``knn`` baseline and the map peers of :mod:`peers` (GPBoost:map and LightGBM:map)
on the random and the spatial-block split, each drawn ``--draws`` times (seeds 0, 1, ...: draw
d takes split seed d and fits every model with seed d, so that the draws also average over the
network's initialisation, as bench_quality's three seeds do; the block side is the one geodbk
chooses for the region unless ``--block-km`` is given). Print per region the NLL of every model
on every draw, its mean over the draws, and dbk-rbf's NLL minus the best map peer's with the
bootstrap sd of that difference (whole blocks, or tiles, resampled). Then PASS/FAIL lines of the
issue "Any region a user picks": on every region dbk-rbf's spatial-block NLL, averaged over the
draws, is no worse than the best peer's average, and its random-split average is at least 0.02
below the best peer's. (Runs before 2026-11-27's fourth session drew the random split once,
seed 0; all runs before its fifth fitted every draw with model seed 0.)

Choices are made on validation data: ``--eval nested`` scores the validation rows with fits
whose own validation rows were cut from their training rows (:func:`nested`), so a variant that
chooses more on its validation rows is not flattered; ``--eval val`` scores the rows the fit
chose on. Reports use the test split (``--eval test``, the default). Model keyword arguments
for ablations go through ``--set`` (``--set coordinate_jitter_m=1000``), as
:func:`geodbk.fit.fitting.fit_dataset` takes them. ``--save-predictions DIR`` writes every fit's
Gaussian predictions before its new-measurement family (:func:`save_predictions`), so that a
change to the family, or to how dbk-rbf's two parts are averaged, can be scored on every fit
without fitting again (docs/small-regions.md, 2026-11-28).
``--region`` runs the same comparison and checks on any other region (counties, a state or a
polygon file), with ``--tiles`` and ``--density`` where the shipped samples do not cover it: the
way to check the defaults on regions that were not tuned on.

Usage::

    .venv/bin/python benchmarks/bench_regions.py                             # every region, test split
    .venv/bin/python benchmarks/bench_regions.py --regions kauai,ponce --eval val --models dbk-rbf,knn
    .venv/bin/python benchmarks/bench_regions.py --eval val --models dbk-rbf --set coordinate_jitter_m=1000
    .venv/bin/python benchmarks/bench_regions.py --eval nested --save-predictions /tmp/parts
    .venv/bin/python benchmarks/bench_regions.py --region "Hawaii, HI" --draws 1      # any region
    .venv/bin/python benchmarks/bench_regions.py --region "Boone, MO" --tiles mobile:2023Q4 --density fixed:2023Q4
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from bench_quality import bootstrap_difference, resampling_units  # benchmarks/, beside this script
from peers import fit_peer, missing_peers

from geodbk.dataset.density import read_density_tiles
from geodbk.dataset.spatial_dataset import SpatialDataset, build_dataset, sample_tiles_path
from geodbk.errors import ExtrapolationWarning
from geodbk.fit.fitting import fit_dataset
from geodbk.fit.metrics import nll_per_row
from geodbk.fit.tails import mean_inverse_tests
from geodbk.ingest.regions import Region, load_region
from geodbk.prediction import Prediction
from geodbk.quarters import Quarter, quarter_years
from geodbk.workflow import DemoConfig


@dataclass(frozen=True)
class Crop:
    """A region to benchmark on: a name, the region (any :func:`~geodbk.ingest.regions.load_region`
    spec: counties joined by ``+``, a state, a polygon file), its mobile tiles and its density
    layer (``None``: the shipped samples of the region's state, Puerto Rico or Hawaii)."""

    name: str
    region: str
    tiles: str | Sequence[str] | None = None
    density: str | Sequence[str] | None = None


#: Hawaii's islands (its counties; Maui County holds Maui, Molokai and Lanai) and Puerto
#: Rico's municipio groups: the San Juan metro area, Ponce, Mayaguez and Vieques with Culebra.
CROPS = {
    crop.name: crop
    for crop in (
        Crop("kauai", "15007"),
        Crop("maui", "15009"),
        Crop("big-island", "15001"),
        Crop("oahu", "15003"),
        # San Juan, Bayamon, Carolina, Guaynabo, Catano, Trujillo Alto, Toa Baja
        Crop("san-juan", "72127+72021+72031+72061+72033+72139+72137"),
        Crop("ponce", "72113+72075"),  # Ponce, Juana Diaz
        Crop("mayaguez", "72097+72067+72011"),  # Mayaguez, Hormigueros, Anasco
        Crop("vieques-culebra", "72147+72049"),
    )
}
MODELS = ("dbk-rbf", "knn", "gpboost:map", "lightgbm:map")
PEER_ROWS = ("gpboost:map", "lightgbm:map")


def crop_region(crop: Crop) -> Region:
    """The crop's region (:func:`~geodbk.ingest.regions.load_region`), named after the crop."""
    return replace(load_region(crop.region), name=crop.name)


def crop_dataset(crop: Crop) -> tuple[SpatialDataset, pd.DataFrame]:
    """The crop's mobile download dataset (random split) and its density tiles (by default the
    region's shipped fixed-broadband tiles)."""
    region = crop_region(crop)
    dataset = build_dataset(crop.tiles or sample_tiles_path(region, "mobile"), region, target="download")
    density = read_density_tiles(crop.density or sample_tiles_path(region, "fixed"), region,
                                 buffer_deg=dataset.buffer_deg)
    return dataset, density


def tile_persistence(frame: pd.DataFrame) -> float:
    """How much a tile's other quarters tell about it: the correlation, over tiles seen in two
    consecutive quarters, of the two quarters' log speeds, each centred on its quarter's mean
    (``frame``: dataset rows with quadkey, year, quarter and y). 0.3-0.4 on most crops; a region
    where it is low is one where a random split's held-out row gains little from its tile's
    other quarters, and a smooth mean gains more (docs/small-regions.md, 2026-11-28)."""
    rows = frame.assign(t=Quarter.index_of(frame["year"], frame["quarter"]))
    rows = rows.assign(centred=rows["y"] - rows.groupby("t")["y"].transform("mean"))[["quadkey", "t", "centred"]]
    pairs = rows.merge(rows.assign(t=rows["t"] - 1), on=["quadkey", "t"], suffixes=("", "_next"))
    if len(pairs) < 3:
        return float("nan")
    return float(np.corrcoef(pairs["centred"], pairs["centred_next"])[0, 1])


def score(
    dataset: SpatialDataset, kind: str, density: pd.DataFrame, on: str, seed: int, settings: dict,
    save_to: Path | None = None,
) -> tuple[float, np.ndarray, float]:
    """Mean NLL of one fit on split ``on``, the per-row NLL (n,) and the fit's seconds; with
    ``save_to``, the fit's predictions are written there (:func:`save_predictions`)."""
    start = time.perf_counter()
    if ":" in kind:
        peer, variant = kind.split(":", 1)
        model = fit_peer(dataset, peer, variant, seed=seed, density_tiles=density)
    else:
        demo = DemoConfig(progress=False, seed=seed)
        model = fit_dataset(dataset, kind, density_tiles=density, **{**demo.overrides(), **settings})
    seconds = time.perf_counter() - start
    rows = dataset.subset(on)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        per_row = nll_per_row(rows["y"].to_numpy(np.float64), model.predict_tiles(rows).measurement())
        if save_to is not None:
            save_predictions(save_to, dataset, model, on)
    return float(per_row.mean()), per_row, seconds


def save_predictions(path: Path, dataset: SpatialDataset, model: Any, on: str) -> None:
    """Write a fit's Gaussian predictions, before its new-measurement family, to the parquet file
    ``path``: one row per validation row (``part`` "val", the rows the family is chosen on) and
    per row of split ``on``, with ``y`` (log10 Mbps), ``tests``, ``mean``, ``sd`` (the tile mean's)
    and ``measurement_sd`` (a new measurement's); for a model averaged with a kriging part, the
    same three of each part (``deep_*``, ``kriging_*``); and ``tests_centre``, the training rows'
    mean 1/tests (:func:`geodbk.fit.tails.fit_measurement_tails` takes it). Refitting the family
    on the "val" rows and scoring the others gives the fit's own NLL."""
    bare = replace(model, tails=None)  # a GeoModel or a peer: both keep the family in ``tails``
    frames = []
    for part in ("val", on):
        rows = dataset.subset(part)
        tests = rows["tests"].to_numpy(np.float64)
        columns: dict[str, Any] = {"part": part, "y": rows["y"].to_numpy(np.float64), "tests": tests}
        parts: tuple[Prediction, Prediction] | None = None
        if hasattr(bare, "predict_with_parts"):
            whole, parts = bare.predict_with_parts(rows[["lon", "lat"]].to_numpy(np.float64),
                                                   quarter_years(rows["year"], rows["quarter"]), tests=tests)
        else:
            whole = bare.predict_tiles(rows)
        named = [("", whole)] + ([] if parts is None else [("deep_", parts[0]), ("kriging_", parts[1])])
        for prefix, prediction in named:
            columns.update({f"{prefix}mean": prediction.mean, f"{prefix}sd": prediction.sd,
                            f"{prefix}measurement_sd": prediction.measurement_sd})
        frames.append(pd.DataFrame(columns))
    centre = mean_inverse_tests(dataset.subset("train")["tests"].to_numpy(np.float64))
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.concat(frames, ignore_index=True).assign(tests_centre=centre).to_parquet(path)


def nested(dataset: SpatialDataset, draw: int) -> SpatialDataset:
    """``dataset`` for choices made on validation rows without scoring the rows they were made on:
    its test rows dropped, its validation rows made the test rows, and new validation rows cut
    from its training rows by the same protocol and block side (split seed ``draw + 1000``;
    the training rows' own test share goes back to training)."""
    frame = dataset.frame
    inner = replace(dataset, frame=frame[frame["split"] == "train"]).with_split(
        dataset.split_protocol, seed=draw + 1000, block_m=dataset.block_m)
    split = frame["split"].copy()
    split[frame["split"] == "test"] = None
    split[frame["split"] == "val"] = "test"
    split.loc[inner.frame.index] = inner.frame["split"].replace({"test": "train"})
    return replace(dataset, frame=frame.assign(split=split)[split.notna()])


def region_table(
    crop: Crop, models: list[str], draws: int, on: str, block_km: float | None, settings: dict,
    save_to: Path | None = None,
) -> tuple[pd.DataFrame, list[tuple[bool, str]]]:
    """One region's NLL table (rows: split and draw, then the means; columns: models) and its
    checks; with ``save_to``, every fit's predictions go to ``<save_to>/<crop>_<split>_<draw>_<model>.parquet``."""
    base, density = crop_dataset(crop)
    print(f"  {crop.name}: {len(base.frame):,} rows, {base.frame['quadkey'].nunique():,} tiles, a tile's consecutive "
          f"quarters correlate {tile_persistence(base.frame):.2f}", file=sys.stderr, flush=True)
    splits = [(split, s) for split in ("random", "spatial-block") for s in range(draws)]
    scored = "test" if on == "nested" else on  # nested: the validation rows, relabelled test
    nll: dict[tuple[str, int, str], np.ndarray] = {}
    spreads: dict[tuple[str, str], list[tuple[float, float]]] = {}  # (split, peer) -> per draw (difference, sd)
    rows = []
    for split, draw in splits:
        dataset = base.with_split(split, seed=draw, block_m=None if block_km is None else 1000.0 * block_km)
        if on == "nested":
            dataset = nested(dataset, draw)
        part = dataset.subset(scored)
        held = f"{len(part):,} {on} rows"
        if split == "spatial-block":
            held += f" in {resampling_units(dataset, scored).max() + 1} blocks of {dataset.block_m / 1000:g} km"
        row = {"split": split, "draw": draw, "rows": held}
        for kind in models:
            name = re.sub(r"[^\w.]+", "-", f"{crop.name}_{split}_{draw}_{kind}.parquet")
            path = None if save_to is None else save_to / name
            mean, per_row, seconds = score(dataset, kind, density, scored, seed=draw, settings=settings, save_to=path)
            nll[(split, draw, kind)] = per_row
            row[kind] = mean
            print(f"  {crop.name} {split} draw {draw} {kind:13s} NLL {mean:.4f} ({seconds:.0f} s; {held})",
                  file=sys.stderr, flush=True)
        if "dbk-rbf" in models:
            for peer in (p for p in PEER_ROWS if p in models):
                difference = nll[(split, draw, "dbk-rbf")] - nll[(split, draw, peer)]
                spread = bootstrap_difference(difference, resampling_units(dataset, scored))
                spreads.setdefault((split, peer), []).append((float(difference.mean()), spread))
            row["dbk-rbf minus"] = minus_column(spreads, split, draw=-1)
        rows.append(row)
    table = pd.DataFrame(rows)
    means = table.groupby("split", sort=False)[models].mean()
    checks = []
    peers = [p for p in PEER_ROWS if p in models]
    if "dbk-rbf" in models and peers:
        for split, margin in (("spatial-block", 0.0), ("random", 0.02)):
            best = min(peers, key=lambda p: means.loc[split, p])
            ours, theirs = means.loc[split, "dbk-rbf"], means.loc[split, best]
            difference, sd = mean_difference(spreads[(split, best)])
            text = (f"{crop.name} {split}: dbk-rbf NLL {ours:.4f} <= best peer {best} {theirs:.4f} - {margin:.2f} "
                    f"(difference {difference:+.3f} +/- {sd:.3f})")
            checks.append((ours <= theirs - margin, text))
    mean_rows = means.reset_index().assign(draw="mean", rows="")
    if "dbk-rbf" in models and peers:
        mean_rows["dbk-rbf minus"] = [minus_column(spreads, split, draw=None) for split in mean_rows["split"]]
    return pd.concat([table, mean_rows], ignore_index=True), checks


def mean_difference(draws: list[tuple[float, float]]) -> tuple[float, float]:
    """The mean over independent draws of (difference, bootstrap sd) pairs, and its sd
    (sqrt of the summed variances over the number of draws)."""
    differences, sds = np.array(draws).T
    return float(differences.mean()), float(np.sqrt(np.sum(sds**2)) / len(sds))


def minus_column(spreads: dict[tuple[str, str], list[tuple[float, float]]], split: str, draw: int | None) -> str:
    """The "dbk-rbf minus" cell of ``split``: each peer's difference +/- its bootstrap sd, for the
    latest draw (``draw=-1``) or the mean over the draws (``None``)."""
    cells = []
    for (split_, peer), draws in spreads.items():
        if split_ == split:
            difference, sd = draws[draw] if draw is not None else mean_difference(draws)
            cells.append(f"{peer} {difference:+.3f}+/-{sd:.3f}")
    return "; ".join(cells)


def parse_settings(pairs: list[str]) -> dict:
    """``--set key=value`` pairs as fit_dataset keyword arguments (values read as Python literals)."""
    settings = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            settings[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            settings[key] = value
    return settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regions", default=",".join(CROPS), help=f"any of {', '.join(CROPS)}")
    parser.add_argument("--region", metavar="SPEC",
                        help="benchmark this region instead (counties such as 'Boone, MO', a state or a polygon file; "
                        "with --tiles and --density outside Puerto Rico and Hawaii)")
    parser.add_argument("--tiles", nargs="+", help="the region's Ookla mobile tile file(s), or 'mobile:2023Q4' for "
                        "Ookla's global file of a quarter (default: the shipped sample)")
    parser.add_argument("--density", nargs="+", help="its density layer, e.g. the fixed tiles or 'fixed:2023Q4' "
                        "(default: the shipped sample)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--draws", type=int, default=3, help="draws of each split (split and model seeds 0, 1, ...)")
    parser.add_argument("--eval", choices=("val", "test", "nested"), default="test",
                        help="the rows scored: test; val (the rows the fit chose on); nested (val, scored by "
                        "fits whose validation rows were cut from their training rows)")
    parser.add_argument("--block-km", type=float, help="spatial-block square (default: geodbk's choice per region)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a fit_dataset keyword for dbk-rbf (repeatable), e.g. coordinate_jitter_m=1000")
    parser.add_argument("--save-predictions", type=Path, metavar="DIR",
                        help="write every fit's predictions before its new-measurement family here (parquet)")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    missing = missing_peers(sorted({m.split(":", 1)[0] for m in models if ":" in m}))
    if missing:
        print("peers left out (pip install -e .[bench]): " + "; ".join(f"{n} ({w})" for n, w in missing.items()))
        models = [m for m in models if m.split(":", 1)[0] not in missing]
    settings = parse_settings(args.set)
    layer = ", ".join(args.density) if args.density else "the shipped fixed tiles"
    print(f"NLL of a new measurement on the {args.eval} split; density layer: {layer}; "
          f"dbk-rbf settings: {settings or 'defaults'}")
    failed = 0
    all_checks = []
    crops = ([Crop(args.region, args.region, args.tiles, args.density)] if args.region
             else [CROPS[name] for name in (r.strip() for r in args.regions.split(",") if r.strip())])
    for crop in crops:
        table, checks = region_table(crop, models, args.draws, args.eval, args.block_km, settings,
                                     args.save_predictions)
        print(f"\n## {crop.name}\n")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        all_checks += checks
    print()
    for ok, text in all_checks:
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
