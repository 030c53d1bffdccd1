"""Seconds and peak memory of every H3 hexagon of Puerto Rico (default resolution 9, the FCC's
mobile map cells, about 124k hexagons).

Without ``--model``: the geometry only (:class:`geodbk.maps.hexagons.HexagonCover`: the cover,
its ids, polygons, sample points and their (hexagon, tile) points; the tile points include a
second pass over the sample points). With ``--model PATH`` (a saved GeoModel, a GP kind): the
whole :func:`geodbk.decisions.hexagon_summary.summarize_hexagons` over the model's fitted region.
Target: 60 s and 2 GB on 2 cores.

    OMP_NUM_THREADS=1 python benchmarks/bench_hexagons.py
    python benchmarks/bench_hexagons.py --model outputs/demo/models/dbk-rbf.pt --resolution 9

Prints each step's seconds, the process's peak RSS (ru_maxrss) and its RSS after imports and
model loading (the baseline the work adds to).
"""

from __future__ import annotations

import argparse
import resource
import time


def _peak_mb() -> float:
    """Peak resident set size of this process since it started, MB (ru_maxrss is KB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a fitted GeoModel file; without it, the geometry only")
    parser.add_argument("--resolution", type=int, default=9, help="H3 resolution, 5 to 10 (default 9)")
    parser.add_argument("--region", default="PR", help="region for the geometry only (default PR)")
    args = parser.parse_args()

    from geodbk.ingest.regions import load_region
    from geodbk.maps.hexagons import HexagonCover

    if args.model is None:
        region = load_region(args.region).geometry
        print(f"baseline RSS {_peak_mb():.0f} MB after imports")
        steps: dict[str, float] = {}
        start = time.perf_counter()
        cover = HexagonCover.over(region, args.resolution)
        steps["cover"] = time.perf_counter() - start
        sizes = {}
        for name, step in (("ids", lambda: cover.ids), ("polygons", cover.polygons),
                           ("sample points", cover.sample_points), ("tile points", cover.tile_points)):
            begin = time.perf_counter()
            result = step()
            sizes[name] = len(result[0]) if name.endswith("points") else len(result)
            steps[name] = time.perf_counter() - begin
        total = time.perf_counter() - start
        print(f"{args.region} resolution {args.resolution}: {len(cover):,} hexagons, {sizes['sample points']:,} "
              f"sample points, {sizes['tile points']:,} (hexagon, tile) points")
        print("  " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in steps.items()))
        print(f"geometry {total:.2f} s, peak RSS {_peak_mb():.0f} MB")
        return

    from geodbk.decisions.hexagon_summary import summarize_hexagons
    from geodbk.fit.geomodel import GeoModel

    model = GeoModel.load(args.model)
    print(f"{model.kind} on {model.info.region}, targets {', '.join(model.targets)}; "
          f"baseline RSS {_peak_mb():.0f} MB after imports and the model")
    start = time.perf_counter()
    summary = summarize_hexagons(model, args.resolution)
    total = time.perf_counter() - start
    print(f"resolution {args.resolution}: {len(summary):,} hexagons in {total:.1f} s "
          f"({len(summary) / total:,.0f} hexagons/s), peak RSS {_peak_mb():.0f} MB")


if __name__ == "__main__":
    main()
