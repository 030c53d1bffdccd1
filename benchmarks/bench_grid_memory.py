"""Peak memory and throughput of chunked grid prediction: 1000x1000 vs 4000x4000 cells on CPU.

Each measurement runs in a fresh subprocess whose peak-RSS mark (VmHWM, Linux) is reset after
imports and model loading, so the peak is that of the prediction itself.
The grid is square, centred on Puerto Rico, with cells outside the island polygon masked (not
predicted); every predicted cell gets mean, sd, the 95% interval and kernel slices at three
reference points. The model is ``--model PATH`` (a saved GeoModel) or, by default, DBK-RBF
fitted for a few epochs on one quarter of the shipped sample.

    python benchmarks/bench_grid_memory.py                 # fit a small model, run 1000 and 4000
    python benchmarks/bench_grid_memory.py --model RUN/models/dbk-rbf.pt --sizes 1000 2000 4000

Prints, per run: grid cells, predicted cells, seconds, cells/s, peak RSS and peak RSS above
the process baseline (imports + model), and the 4000/1000 ratios of time and of that increment.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _rss_mb() -> float:
    """Current resident set size of this process in MB (Linux /proc)."""
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) so setup does not count; False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _peak_mb() -> float:
    """Peak RSS in MB since the last :func:`_reset_peak` (VmHWM), else since process start."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KB on Linux


def worker(model_path: str, size: int, mode: str, out_dir: str, refs: bool) -> dict:
    """Predict one ``size`` x ``size`` grid; returns the measurements (runs in its own process)."""
    import numpy as np
    from affine import Affine

    from geodbk.geomodel import GeoModel
    from geodbk.grids import WGS84, RegularGrid, predict_grid
    from geodbk.regions import load_region

    model = GeoModel.load(model_path)
    region = load_region("PR")
    west, south, east, north = region.geometry.bounds
    side = max(east - west, north - south)
    cy = (south + north) / 2.0
    res = side / size
    grid = RegularGrid(WGS84, Affine(res, 0.0, west, 0.0, -res, cy + side / 2.0), size, size, region.geometry, "PR")
    ref_points = {"sanjuan": (-66.06, 18.45), "ponce": (-66.61, 18.01), "mona": (-67.90, 18.09)} if refs else None
    store = None if mode == "memory" else str(Path(out_dir) / f"grid_{size}.zarr")
    # warm up on a tiny grid with the same output kind, so that lazy imports (zarr, dask) and
    # torch's first allocations are part of the baseline, not of the measured increment
    small = RegularGrid.over(region, side / 50)
    predict_grid(model, small, refs=ref_points, store=None if store is None else str(Path(out_dir) / f"warm_{size}.zarr"),
                 progress=False)
    baseline = _rss_mb()
    _reset_peak()
    start = time.perf_counter()
    ds = predict_grid(model, grid, refs=ref_points, store=store, progress=False)
    seconds = time.perf_counter() - start
    peak = _peak_mb()  # before the count below, which reads the whole mean layer
    predicted = int(np.isfinite(ds["mean"].values).sum())
    return {
        "size": size,
        "mode": mode,
        "cells": size * size,
        "predicted": predicted,
        "chunk_rows": grid.default_chunk_rows(),
        "seconds": seconds,
        "baseline_mb": baseline,
        "peak_mb": peak,
    }


def fit_small_model(path: Path) -> None:
    from geodbk.dataset import load_sample_dataset
    from geodbk.geomodel import fit_dataset
    from geodbk.train import TrainConfig

    dataset = load_sample_dataset("PR", quarters=["2023Q4"])
    fit_dataset(dataset, "dbk-rbf", train_config=TrainConfig(epochs=5, device="cpu", progress=False)).save(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="saved GeoModel (default: fit DBK-RBF for 5 epochs on PR 2023Q4)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000], help="grid sides (default 1000 4000)")
    parser.add_argument("--modes", nargs="+", default=["zarr", "memory"], choices=("zarr", "memory"),
                        help="zarr: blocks written to a Zarr store; memory: preallocated float32 arrays")
    parser.add_argument("--no-refs", action="store_true", help="skip the three kernel slices")
    parser.add_argument("--worker", nargs=3, metavar=("SIZE", "MODE", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        size, mode, out_dir = args.worker
        print(json.dumps(worker(args.model, int(size), mode, out_dir, not args.no_refs)))
        return

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            model = str(Path(tmp) / "dbk-rbf.pt")
            print("fitting DBK-RBF (5 epochs, PR 2023Q4) ...", flush=True)
            fit_small_model(Path(model))
        rows = []
        for mode in args.modes:
            for size in args.sizes:
                cmd = [sys.executable, __file__, "--model", model, "--worker", str(size), mode, tmp]
                if args.no_refs:
                    cmd.append("--no-refs")
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode != 0:
                    sys.exit(f"worker {size} {mode} failed:\n{done.stderr}")
                row = json.loads(done.stdout.strip().splitlines()[-1])
                rows.append(row)
                print(
                    f"{mode:6s} {size:5d}x{size:<5d} cells {row['cells']:>10,d}  predicted {row['predicted']:>9,d}  "
                    f"{row['seconds']:7.1f} s  {row['cells'] / row['seconds']:>10,.0f} grid cells/s  "
                    f"{row['predicted'] / row['seconds']:>8,.0f} predicted/s  peak {row['peak_mb']:7.0f} MB  "
                    f"(+{row['peak_mb'] - row['baseline_mb']:.0f} MB over baseline {row['baseline_mb']:.0f} MB)",
                    flush=True,
                )
        for mode in args.modes:
            mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["size"])
            if len(mine) >= 2:
                a, b = mine[0], mine[-1]
                grow = (b["peak_mb"] - b["baseline_mb"]) / max(a["peak_mb"] - a["baseline_mb"], 1.0)
                print(
                    f"{mode}: {b['size']}^2 / {a['size']}^2 = {b['cells'] / a['cells']:.0f}x cells -> "
                    f"{b['seconds'] / a['seconds']:.1f}x time, {grow:.2f}x peak memory above baseline"
                )


if __name__ == "__main__":
    main()
