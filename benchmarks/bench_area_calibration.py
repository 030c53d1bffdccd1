"""Are area means and their joint-posterior sd calibrated? Municipio averages of held-out tiles.

For a fitted run folder (default ``outputs/demo``, from ``geodbk demo``) and a polygon file
(default the shipped Census counties; Puerto Rico's 78 municipios), each polygon's test tiles
of one quarter are averaged twice: the observed mean of their log10 speeds, and the model's
area mean over the same tile centres (:meth:`GeoModel.predict_areas`, equal weights). The
observed mean also carries each tile's own measurement noise (sigma1^2 / tests, not part of
the tile-mean surface), which is added to the predicted variance. The script prints, per
model, the z-scores' sd (1 when calibrated; below 1 means the sd is conservative), the 95%
interval coverage over the polygons and the median area sd next to the median cell sd.

    .venv/bin/python benchmarks/bench_area_calibration.py --run outputs/demo --quarter 2023Q4
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np
import shapely

from geodbk.dataset.quarters import parse_quarter_label
from geodbk.dataset.spatial_dataset import SpatialDataset
from geodbk.errors import ExtrapolationWarning
from geodbk.fit.geomodel import GeoModel
from geodbk.ingest.regions import load_region, read_polygons
from geodbk.paths import COUNTY_BOUNDARIES
from geodbk.prediction import Z95


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="outputs/demo", help="run folder from geodbk demo / fit")
    parser.add_argument("--polygons", default=str(COUNTY_BOUNDARIES))
    parser.add_argument("--quarter", default=None, help="quarter (default the dataset's latest)")
    parser.add_argument("--min-tiles", type=int, default=5, help="polygons with fewer test tiles are skipped")
    args = parser.parse_args()
    warnings.simplefilter("ignore", ExtrapolationWarning)

    run = Path(args.run)
    dataset = SpatialDataset.load(run / "dataset.parquet")
    quarter = args.quarter or dataset.quarters[-1]
    year, q = parse_quarter_label(quarter)
    tiles = dataset.subset("test")
    tiles = tiles[(tiles["year"] == year) & (tiles["quarter"] == q)]
    region = load_region(dataset.region.name).geometry
    polygons = read_polygons(args.polygons)
    polygons = polygons[polygons.intersects(region)].reset_index(drop=True)
    lonlat = tiles[["lon", "lat"]].to_numpy(np.float64)
    group = np.full(len(tiles), -1)
    for index, geometry in enumerate(polygons.geometry):
        group[shapely.contains_xy(geometry, lonlat[:, 0], lonlat[:, 1])] = index
    counts = np.bincount(group[group >= 0], minlength=len(polygons))
    keep_groups = np.flatnonzero(counts >= args.min_tiles)
    remap = np.full(len(polygons), -1)
    remap[keep_groups] = np.arange(len(keep_groups))
    rows = (group >= 0) & (remap[np.maximum(group, 0)] >= 0)
    lonlat, groups = lonlat[rows], remap[group[rows]]
    y, tests = tiles["y"].to_numpy(np.float64)[rows], tiles["tests"].to_numpy(np.float64)[rows]
    n = np.bincount(groups)
    observed = np.bincount(groups, weights=y) / n
    print(f"{dataset.region.name} {quarter}: {len(keep_groups)} polygons with >= {args.min_tiles} test tiles "
          f"({int(n.sum())} tiles, median {int(np.median(n))} per polygon)")
    print(f"{'model':<10} {'z sd':>6} {'cover95':>8} {'area sd':>8} {'cell sd':>8} {'|err|':>7}")
    for path in sorted((run / "models").glob("*.pt")):
        model = GeoModel.load(path)
        if not model.has_kernel:
            continue
        area = model.predict_areas(lonlat, groups, len(keep_groups), quarter)
        cell = model.predict(lonlat, quarter, tests=tests)
        extra = np.bincount(groups, weights=cell.measurement_sd**2 - cell.sd**2) / n**2
        sd = np.sqrt(area.sd**2 + extra)
        z = (observed - area.mean) / sd
        cover = float(np.mean(np.abs(z) <= Z95))
        print(f"{model.kind:<10} {z.std():6.3f} {cover:8.1%} {np.median(area.sd):8.3f} {np.median(cell.sd):8.3f} "
              f"{np.median(np.abs(observed - area.mean)):7.3f}")


if __name__ == "__main__":
    main()
