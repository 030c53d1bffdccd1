"""Peak memory and throughput of chunked grid prediction on CPU.

Two sweeps, each measurement in a fresh subprocess whose peak-RSS mark (VmHWM, Linux) is reset
after imports, model loading and a warm-up on a tiny grid, so the peak is that of the
prediction itself:

* grid size (``--sizes``, default 1000 and 4000 cells a side; ``--modes`` zarr / memory),
  one quarter, by default with a model fitted on PR 2023Q4 only;
* number of quarters (``--quarters 1,20``) on one ``--size`` x ``--size`` grid (default
  2000) streamed to Zarr with a CF ``time`` dimension, by default with a model fitted on every quarter of
  the PR sample (19 quarters, 2019Q1-2023Q4 without 2020Q2). The N mapped quarters are the N
  consecutive quarter labels ending at the last fitted quarter, so 20 is 2019Q1-2023Q4: the 19
  fitted quarters plus 2020Q2, which lies inside the fitted time range. When N reaches back
  before the first fitted quarter, the labels run on past the last fitted one instead (an
  extrapolation; the output says so). ExtrapolationWarnings are silenced and counted.

The grid is square, centred on Puerto Rico, with cells outside the island polygon masked (not
predicted); every predicted cell gets mean, sd, the 95% interval, p_below and kernel slices at
three reference points. The model is ``--model PATH`` (a saved GeoModel, used by both sweeps)
or, by default, DBK-RBF fitted for 5 epochs on the shipped sample.

    python benchmarks/bench_grid_memory.py                 # fit a small model, run 1000 and 4000
    python benchmarks/bench_grid_memory.py --model RUN/models/dbk-rbf.pt --sizes 1000 2000 4000
    python benchmarks/bench_grid_memory.py --quarters 1,20 --size 2000   # the time sweep only
    python benchmarks/bench_grid_memory.py --quarters 1,20 --sizes 1000  # both sweeps

``--quarters`` alone runs only the quarter sweep; give ``--sizes`` as well to run both.

Prints, per run: grid cells, predicted cells, seconds, cells/s, peak RSS and peak RSS above
the process baseline (imports + model); for the size sweep the 4000/1000 ratios of time and of
that increment, for the quarter sweep a table and the ratio of the largest to the smallest
quarter count's peak (absolute and above baseline). With ``--size`` below ``--target-size``
(default 2000) it also prints the time extrapolated to ``--target-size`` (cells scale with the
area), labelled as such.
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


REF_POINTS = {"sanjuan": (-66.06, 18.45), "ponce": (-66.61, 18.01), "mona": (-67.90, 18.09)}


def _square_grid(size: int):
    """``(region, grid, side)``: PR and a ``size`` x ``size`` lon/lat grid centred on it."""
    from affine import Affine

    from geodbk.ingest.regions import load_region
    from geodbk.maps.geometry import WGS84, RegularGrid

    region = load_region("PR")
    west, south, east, north = region.geometry.bounds
    side = max(east - west, north - south)
    cy = (south + north) / 2.0
    res = side / size
    grid = RegularGrid(WGS84, Affine(res, 0.0, west, 0.0, -res, cy + side / 2.0), size, size, region.geometry, "PR")
    return region, grid, side


def worker(model_path: str, size: int, mode: str, out_dir: str, refs: bool) -> dict:
    """Predict one ``size`` x ``size`` grid; returns the measurements (runs in its own process)."""
    import numpy as np

    from geodbk.fit.geomodel import GeoModel
    from geodbk.maps.geometry import RegularGrid
    from geodbk.maps.predict import predict_grid

    model = GeoModel.load(model_path)
    region, grid, side = _square_grid(size)
    ref_points = REF_POINTS if refs else None
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


def _next_quarter(label: str, step: int) -> str:
    year, q = int(label[:4]), int(label[5])
    index = year * 4 + (q - 1) + step
    return f"{index // 4}Q{index % 4 + 1}"


def quarter_labels(fitted: list[str], n: int) -> tuple[list[str], str]:
    """``n`` consecutive quarter labels for a model fitted on ``fitted``, and how they relate.

    The ``n`` quarters ending at the last fitted one; if that reaches back before the first
    fitted quarter, the ``n`` quarters starting at the first fitted one (running past the last).
    """
    first, last = min(fitted), max(fitted)
    labels = [_next_quarter(last, k - n + 1) for k in range(n)]
    if labels[0] < first:
        labels = [_next_quarter(first, k) for k in range(n)]
    inside = [q for q in labels if q in fitted]
    gaps = [q for q in labels if q not in fitted and first <= q <= last]
    after = [q for q in labels if q > last]
    note = f"{labels[0]}-{labels[-1]}: {len(inside)} fitted"
    if gaps:
        note += f" + {len(gaps)} inside the fitted range but not fitted ({','.join(gaps)})"
    if after:
        note += f" + {len(after)} after the last fitted quarter {last} (extrapolation)"
    return labels, note


def quarter_worker(model_path: str, size: int, n_quarters: int, out_dir: str, refs: bool,
                   chunk_rows: int | None) -> dict:
    """Stream one ``size`` x ``size`` grid with ``n_quarters`` quarters to Zarr (own process)."""
    import warnings

    import numpy as np

    from geodbk.errors import ExtrapolationWarning
    from geodbk.fit.geomodel import GeoModel
    from geodbk.maps.geometry import RegularGrid
    from geodbk.maps.predict import predict_grid

    model = GeoModel.load(model_path)
    labels, note = quarter_labels(list(model.info.quarters), n_quarters)
    region, grid, side = _square_grid(size)
    ref_points = REF_POINTS if refs else None
    store = str(Path(out_dir) / f"grid_{size}_{n_quarters}q.zarr")
    # warm up (same quarters, same output kind) so lazy imports and first allocations are baseline
    small = RegularGrid.over(region, side / 50)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        predict_grid(model, small, refs=ref_points, time=labels, store=str(Path(out_dir) / f"warm_{n_quarters}q.zarr"),
                     progress=False)
    baseline = _rss_mb()
    setup_peak = _peak_mb()  # imports + model + warm-up, before the reset
    _reset_peak()
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ExtrapolationWarning)
        ds = predict_grid(model, grid, refs=ref_points, time=labels, store=store, chunk_rows=chunk_rows,
                          progress=False)
    seconds = time.perf_counter() - start
    peak = _peak_mb()  # before the count below, which reads one time slice of the mean layer
    extrapolation = [str(w.message) for w in caught if issubclass(w.category, ExtrapolationWarning)]
    predicted = int(np.isfinite(ds["mean"].isel(time=-1).values).sum())
    rows_per_block = chunk_rows or max(1, grid.default_chunk_rows() // n_quarters)
    rows_per_block = min(rows_per_block, grid.height)
    store_mb = sum(f.stat().st_size for f in Path(store).rglob("*") if f.is_file()) / 2**20
    return {
        "size": size,
        "quarters": n_quarters,
        "labels": note,
        "cells": size * size,
        "predicted": predicted,
        "predictions": predicted * n_quarters,
        "dims": {name: list(ds[name].dims) for name in ("mean", "p_below") if name in ds},
        "chunk_rows": rows_per_block,
        "blocks": -(-grid.height // rows_per_block),
        "seconds": seconds,
        "baseline_mb": baseline,
        "setup_peak_mb": setup_peak,
        "peak_mb": peak,
        "store_mb": store_mb,
        "extrapolation": extrapolation[:1],
    }


def fit_small_model(path: Path, quarters: tuple[str, ...] | None = ("2023Q4",)) -> None:
    """DBK-RBF, 5 epochs, on the PR sample's ``quarters`` (None: every quarter), saved to ``path``."""
    from geodbk.dataset.spatial_dataset import load_sample_dataset
    from geodbk.fit.fitting import fit_dataset

    dataset = load_sample_dataset("PR", quarters=None if quarters is None else list(quarters))
    fit_dataset(dataset, "dbk-rbf", epochs=5, device="cpu", progress=False).save(path)


def _run_child(args: list[str], what: str) -> dict:
    cmd = [sys.executable, __file__, *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"worker {what} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def size_sweep(model: str, sizes: list[int], modes: list[str], tmp: str, no_refs: bool) -> None:
    rows = []
    for mode in modes:
        for size in sizes:
            row = _run_child(["--model", model, "--worker", str(size), mode, tmp] + (["--no-refs"] if no_refs else []),
                             f"{size} {mode}")
            rows.append(row)
            print(
                f"{mode:6s} {size:5d}x{size:<5d} cells {row['cells']:>10,d}  predicted {row['predicted']:>9,d}  "
                f"{row['seconds']:7.1f} s  {row['cells'] / row['seconds']:>10,.0f} grid cells/s  "
                f"{row['predicted'] / row['seconds']:>8,.0f} predicted/s  peak {row['peak_mb']:7.0f} MB  "
                f"(+{row['peak_mb'] - row['baseline_mb']:.0f} MB over baseline {row['baseline_mb']:.0f} MB)",
                flush=True,
            )
    for mode in modes:
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["size"])
        if len(mine) >= 2:
            a, b = mine[0], mine[-1]
            grow = (b["peak_mb"] - b["baseline_mb"]) / max(a["peak_mb"] - a["baseline_mb"], 1.0)
            print(
                f"{mode}: {b['size']}^2 / {a['size']}^2 = {b['cells'] / a['cells']:.0f}x cells -> "
                f"{b['seconds'] / a['seconds']:.1f}x time, {grow:.2f}x peak memory above baseline"
            )


def quarter_sweep(model: str, counts: list[int], size: int, tmp: str, no_refs: bool, chunk_rows: int | None,
                  target_size: int) -> None:
    print(f"\nquarter sweep: {size}x{size} grid over PR streamed to Zarr, per-quarter layers (time, y, x), "
          f"{'no kernel slices' if no_refs else 'kernel slices at 3 reference points'}; each row a fresh process",
          flush=True)
    rows = []
    for n in counts:
        args = ["--model", model, "--qworker", str(n), str(size), tmp]
        args += ["--no-refs"] if no_refs else []
        args += ["--chunk-rows", str(chunk_rows)] if chunk_rows else []
        row = _run_child(args, f"{n} quarters at {size}")
        rows.append(row)
        print(f"  {n:2d} quarter(s): {row['labels']}; mean dims {tuple(row['dims']['mean'])}; "
              f"setup peak (imports + model + warm-up) {row['setup_peak_mb']:.0f} MB; "
              f"ExtrapolationWarning (silenced): {row['extrapolation'][0] if row['extrapolation'] else 'none'}",
              flush=True)
    head = (f"{'quarters':>8s} {'grid':>9s} {'cells':>10s} {'predicted':>9s} {'predictions':>11s} {'blocks':>6s} "
            f"{'rows/blk':>8s} {'seconds':>8s} {'pred/s':>8s} {'base MB':>7s} {'peak MB':>7s} {'+MB':>6s} "
            f"{'+MB/qtr':>7s} {'B/blk val':>9s} {'zarr MB':>7s}")
    print(head)
    for r in rows:
        extra = r["peak_mb"] - r["baseline_mb"]
        block_values = r["chunk_rows"] * r["size"] * r["quarters"]  # cells x quarters in one block
        print(f"{r['quarters']:8d} {r['size']:4d}x{r['size']:<4d} {r['cells']:10,d} {r['predicted']:9,d} "
              f"{r['predictions']:11,d} {r['blocks']:6d} {r['chunk_rows']:8d} {r['seconds']:8.1f} "
              f"{r['predictions'] / r['seconds']:8,.0f} {r['baseline_mb']:7.0f} {r['peak_mb']:7.0f} {extra:6.0f} "
              f"{extra / r['quarters']:7.1f} {extra * 2**20 / block_values:9.1f} {r['store_mb']:7.1f}")
    print("  peak MB: peak RSS during predict_grid (VmHWM reset after setup); base MB: RSS after imports, model "
          "and warm-up;\n  +MB: peak - base; B/blk val: +MB in bytes per (block cells x quarters)")
    if len(rows) >= 2:
        a, b = min(rows, key=lambda r: r["quarters"]), max(rows, key=lambda r: r["quarters"])
        grow = (b["peak_mb"] - b["baseline_mb"]) / max(a["peak_mb"] - a["baseline_mb"], 1.0)
        print(f"{b['quarters']} / {a['quarters']} quarters: {b['predictions'] / a['predictions']:.0f}x predictions -> "
              f"{b['seconds'] / a['seconds']:.1f}x time, peak RSS {b['peak_mb']:.0f} / {a['peak_mb']:.0f} MB = "
              f"{b['peak_mb'] / a['peak_mb']:.2f}x, above baseline {grow:.2f}x")
    if size < target_size:
        scale = (target_size / size) ** 2
        for r in rows:
            print(f"EXTRAPOLATED, not measured: {r['quarters']} quarter(s) at {target_size}x{target_size} ~ "
                  f"{r['seconds'] * scale:.0f} s (measured {r['seconds']:.1f} s at {size}x{size} x {scale:.1f} cells)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="saved GeoModel (default: fit DBK-RBF for 5 epochs on PR 2023Q4 for the "
                                        "size sweep, on every PR quarter for the quarter sweep)")
    parser.add_argument("--sizes", type=int, nargs="+", help="grid sides of the size sweep (default 1000 4000)")
    parser.add_argument("--modes", nargs="+", default=["zarr", "memory"], choices=("zarr", "memory"),
                        help="zarr: blocks written to a Zarr store; memory: preallocated float32 arrays")
    parser.add_argument("--no-refs", action="store_true", help="skip the three kernel slices")
    parser.add_argument("--quarters", type=lambda t: [int(v) for v in t.split(",")],
                        help="quarter sweep: comma-separated numbers of quarters, e.g. 1,20 (runs only this sweep "
                             "unless --sizes is given too)")
    parser.add_argument("--size", type=int, default=2000, help="grid side of the quarter sweep (default 2000)")
    parser.add_argument("--target-size", type=int, default=2000,
                        help="with --size below this, also print times extrapolated to it (default 2000)")
    parser.add_argument("--chunk-rows", type=int, help="rows per block in the quarter sweep (default: predict_grid's)")
    parser.add_argument("--worker", nargs=3, metavar=("SIZE", "MODE", "DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--qworker", nargs=3, metavar=("QUARTERS", "SIZE", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        size, mode, out_dir = args.worker
        print(json.dumps(worker(args.model, int(size), mode, out_dir, not args.no_refs)))
        return
    if args.qworker:
        n, size, out_dir = args.qworker
        print(json.dumps(quarter_worker(args.model, int(size), int(n), out_dir, not args.no_refs, args.chunk_rows)))
        return
    if args.quarters is not None and (not args.quarters or min(args.quarters) < 1):
        parser.error("--quarters takes positive counts, e.g. 1,20")

    run_sizes = args.quarters is None or args.sizes is not None
    with tempfile.TemporaryDirectory() as tmp:
        if run_sizes:
            model = args.model
            if model is None:
                model = str(Path(tmp) / "dbk-rbf.pt")
                print("fitting DBK-RBF (5 epochs, PR 2023Q4) ...", flush=True)
                fit_small_model(Path(model))
            size_sweep(model, args.sizes or [1000, 4000], args.modes, tmp, args.no_refs)
        if args.quarters is not None:
            model = args.model
            if model is None:
                model = str(Path(tmp) / "dbk-rbf-all.pt")
                print("fitting DBK-RBF (5 epochs, every PR quarter) ...", flush=True)
                start = time.perf_counter()
                fit_small_model(Path(model), quarters=None)
                print(f"  fitted in {time.perf_counter() - start:.0f} s", flush=True)
            quarter_sweep(model, args.quarters, args.size, tmp, args.no_refs, args.chunk_rows, args.target_size)


if __name__ == "__main__":
    main()
