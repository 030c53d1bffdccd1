"""Are area means and their joint-posterior sd calibrated? Squares and counties of held-out tiles.

For each region (the shipped PR and HI download samples) the models are fitted on a split
(default ``random``), and the held-out tiles of the chosen split (default ``test``) are
grouped, every quarter, into square areas of 2, 5 and 10 km (in the data's equal-area
projection) and into counties / municipios (the shipped Census file). Each area's tiles are
averaged twice: the observed mean of their log10 speeds, and the model's area mean over the
same tile centres (:meth:`GeoModel.predict_areas`, equal weights) with its joint sd. The
observed mean also carries each tile's own measurement noise (the part of a new
measurement's variance that is not in the tile-mean surface), which is added, and each tile's
test-count shift (a tile of k tests is measured ``tests_shift (1/k - c)`` away from the tile mean,
:mod:`geodbk.fit.tails`), whose mean over the area's tiles moves the area mean, as the hexagons
of ``bench_decisions.py`` have it. Runs before 2026-11-28's twelfth session left the shift out.

Printed per model and area kind: the z-scores' sd (1 when calibrated; below 1 means the
sd is too wide), 95% coverage over the areas, the median area sd and the median |error|.
Peers without a joint posterior (LightGBM, GPBoost; ``benchmarks/peers.py``) are scored with
independent cells (their sd of a mean of n tiles is the root mean square of the tile sds
over sqrt(n)), the only uncertainty they offer.

    .venv/bin/python benchmarks/bench_area_calibration.py                       # PR and HI
    .venv/bin/python benchmarks/bench_area_calibration.py --regions PR --models dbk-rbf --eval val
    .venv/bin/python benchmarks/bench_area_calibration.py --run outputs/demo    # a run folder's models
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import shapely

from geodbk.dataset.coords import ProjectedTransform
from geodbk.dataset.spatial_dataset import SpatialDataset, load_sample_dataset
from geodbk.errors import ExtrapolationWarning
from geodbk.fit.fitting import fit_dataset
from geodbk.fit.geomodel import GeoModel
from geodbk.ingest.regions import read_polygons
from geodbk.paths import COUNTY_BOUNDARIES
from geodbk.prediction import Z95
from geodbk.workflow import DemoConfig

SQUARES_KM = (2.0, 5.0, 10.0)
#: Areas with fewer held-out tiles are skipped.
MIN_TILES = 3
#: Acceptance band of the issue "Maps that beat the strongest practical peer".
Z_SD_BAND, COVERAGE_BAND = (0.85, 1.15), (0.92, 0.98)


@dataclass
class Areas:
    """Held-out tiles of one quarter grouped into areas of one kind.

    Attributes:
        kind: ``"2 km"``, ..., or ``"county"``.
        quarter: the quarter label.
        tiles: the tiles (rows of the dataset), (n,).
        groups: (n,) area index of each tile, in [0, n_areas).
        n_areas: the number of areas.
    """

    kind: str
    quarter: str
    tiles: pd.DataFrame
    groups: np.ndarray
    n_areas: int


def _compact(labels: np.ndarray, min_tiles: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose label has at least ``min_tiles`` members (n,) bool, and their labels renumbered 0.."""
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    keep = counts[inverse] >= min_tiles
    _, renumbered = np.unique(inverse[keep], return_inverse=True)
    return keep, renumbered


def area_sets(dataset: SpatialDataset, split: str, min_tiles: int = MIN_TILES) -> Iterator[Areas]:
    """Every (area kind, quarter) grouping of the ``split`` tiles: squares of :data:`SQUARES_KM`
    in the dataset's equal-area projection, then counties/municipios."""
    frame = dataset.subset(split)
    lonlat = frame[["lon", "lat"]].to_numpy(np.float64)
    xy = ProjectedTransform.from_lonlat(dataset.frame[["lon", "lat"]].to_numpy(np.float64)).to_metres(lonlat)
    polygons = read_polygons(COUNTY_BOUNDARIES)
    polygons = polygons[polygons.intersects(dataset.region.geometry)].reset_index(drop=True)
    county = np.full(len(frame), -1)
    for index, geometry in enumerate(polygons.geometry):
        county[shapely.contains_xy(geometry, lonlat[:, 0], lonlat[:, 1])] = index
    labels = {f"{km:g} km": np.floor(xy / (1000.0 * km)).astype(np.int64) @ np.array([1, 1 << 32])
              for km in SQUARES_KM}
    labels["county"] = county
    quarter_of = frame["year"].astype(str).to_numpy() + "Q" + frame["quarter"].astype(str).to_numpy()
    for kind, label in labels.items():
        for quarter in sorted(set(quarter_of)):
            rows = (quarter_of == quarter) & (label >= 0 if kind == "county" else True)
            keep, groups = _compact(label[rows], min_tiles)
            if len(groups):
                yield Areas(kind, quarter, frame[rows][keep], groups, int(groups.max()) + 1)


def joint_areas(model: GeoModel) -> Callable[[Areas], tuple[np.ndarray, np.ndarray]]:
    """Area mean and the sd of (observed mean - area mean) from the model's joint posterior."""

    def score(areas: Areas) -> tuple[np.ndarray, np.ndarray]:
        lonlat = areas.tiles[["lon", "lat"]].to_numpy(np.float64)
        area = model.predict_areas(lonlat, areas.groups, areas.n_areas, areas.quarter)
        cell = model.predict_tiles(areas.tiles)
        n = np.bincount(areas.groups)
        noise = np.bincount(areas.groups, weights=cell.measurement_sd**2 - cell.sd**2) / n**2
        shift = np.bincount(areas.groups, weights=cell.measurement().mean - cell.mean) / n
        return area.mean + shift, np.sqrt(area.sd**2 + noise)

    return score


def independent_areas(predict_tiles: Callable[[pd.DataFrame], Any]) -> Callable[[Areas], tuple[np.ndarray, np.ndarray]]:
    """Area mean and sd for a predictor with tile marginals only (cells taken as independent)."""

    def score(areas: Areas) -> tuple[np.ndarray, np.ndarray]:
        cell = predict_tiles(areas.tiles)
        n = np.bincount(areas.groups)
        mean = np.bincount(areas.groups, weights=cell.measurement().mean) / n  # with the test-count shift
        return mean, np.sqrt(np.bincount(areas.groups, weights=cell.measurement_sd**2) / n**2)

    return score


def calibration(score: Callable[[Areas], tuple[np.ndarray, np.ndarray]], sets: list[Areas]) -> pd.DataFrame:
    """z sd, 95% coverage, median sd and median |error| per area kind (rows), over all quarters."""
    rows = []
    for kind in dict.fromkeys(a.kind for a in sets):
        z, sd, err = [], [], []
        for areas in (a for a in sets if a.kind == kind):
            y = areas.tiles["y"].to_numpy(np.float64)
            observed = np.bincount(areas.groups, weights=y) / np.bincount(areas.groups)
            mean, area_sd = score(areas)
            z.append((observed - mean) / area_sd)
            sd.append(area_sd)
            err.append(np.abs(observed - mean))
        zs = np.concatenate(z)
        rows.append({"area": kind, "n_areas": len(zs), "z_sd": float(zs.std()),
                     "coverage95": float(np.mean(np.abs(zs) <= Z95)),
                     "median_sd": float(np.median(np.concatenate(sd))),
                     "median_abs_err": float(np.median(np.concatenate(err)))})
    return pd.DataFrame(rows).set_index("area")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regions", default="PR,HI")
    parser.add_argument("--split", default="random", help="split protocol the models are fitted on")
    parser.add_argument("--split-seed", type=int, help="seed of the split (default the dataset's, 0): another "
                        "draw of the held-out tiles, to see how much a number moves with the split")
    parser.add_argument("--eval", choices=("val", "test"), default="test", help="held-out tiles that form the areas")
    parser.add_argument("--models", default="dbk-rbf,sv-dkl,lightgbm:map,gpboost:map",
                        help="geodbk kinds and peers (benchmarks/peers.py: lightgbm:map, gpboost:map, ...)")
    parser.add_argument("--run", help="score the models of this run folder (its dataset and split) instead of fitting")
    parser.add_argument("--min-tiles", type=int, default=MIN_TILES)
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--no-density", action="store_true", help="no fixed-broadband density layer (as the demo's)")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", ExtrapolationWarning)
    # its settings over the protocol's, as the demo, density layer included
    demo = DemoConfig(progress=False, epochs=args.epochs, density=not args.no_density)

    if args.run:
        run = Path(args.run)
        jobs = [(SpatialDataset.load(run / "dataset.parquet"), sorted((run / "models").glob("*.pt")))]
    else:
        jobs = [(load_sample_dataset(r.strip(), "download").with_split(args.split, seed=args.split_seed),
                 args.models.split(","))
                for r in args.regions.split(",") if r.strip()]
    failed = 0
    for dataset, models in jobs:
        sets = list(area_sets(dataset, args.eval, args.min_tiles))
        density = None if args.run else demo.density_tiles(dataset)
        print(f"\n## {dataset.region.name}, fitted on the {dataset.split_protocol} split, areas of {args.eval} tiles "
              f"(z sd 1 = calibrated; coverage in %)\n", flush=True)
        for model_name in models:
            if isinstance(model_name, Path):
                model = GeoModel.load(model_name)
                if not model.has_kernel:
                    continue
                name, score = model.kind, joint_areas(model)
            elif ":" in model_name:
                sys.path.insert(0, str(Path(__file__).parent))
                try:
                    import peers
                except ImportError as err:
                    print(f"  {model_name}: skipped ({err})")
                    continue
                peer = peers.fit_peer(dataset, *model_name.split(":"), density_tiles=density)
                name, score = model_name, independent_areas(peer.predict_tiles)
            else:
                model = fit_dataset(dataset, model_name, density_tiles=density, **demo.overrides())
                name, score = model_name, joint_areas(model)
            table = calibration(score, sets)
            table["coverage95"] *= 100
            print(f"{name}\n{table.round(3).to_string()}\n", flush=True)
            if name == "dbk-rbf":
                for area, row in table.iterrows():
                    cover = row.coverage95 / 100
                    ok = Z_SD_BAND[0] <= row.z_sd <= Z_SD_BAND[1] and COVERAGE_BAND[0] <= cover <= COVERAGE_BAND[1]
                    failed += not ok
                    print(f"{'PASS' if ok else 'FAIL'}  {dataset.region.name} dbk-rbf {area}: z sd {row.z_sd:.3f} in "
                          f"{Z_SD_BAND}, coverage {row.coverage95:.1f}% in [92, 98]")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
