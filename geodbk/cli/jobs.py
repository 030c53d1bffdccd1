"""``geodbk serve`` (the Panel dashboard over run folders) and ``geodbk demo`` (the README's main job)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from geodbk.cli.options import (
    add_block_option,
    add_extrapolation_option,
    add_map_options,
    block_metres,
    check_device,
    check_listen_address,
    check_map_options,
    check_split_options,
    parse_change,
    parse_quarter,
    parse_quarter_list,
)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="open the interactive Panel dashboard",
        description="Serve apps/dashboard.py with `panel serve` over one or more run folders "
        "(written by `geodbk demo`), over an OpenStreetMap basemap. Hover the map for a cell's "
        "median, 95% interval and P(below the threshold); click it to see the kernel slice and the "
        "predictive distribution at that point.",
        epilog="example: geodbk serve --run outputs/demo --port 5006 --show",
    )
    p.add_argument("--run", action="append", metavar="DIR",
                   help="run folder (repeat to compare runs, e.g. download and upload); default outputs/demo")
    p.add_argument("--port", type=int, default=5006, help="port to listen on (default 5006)")
    p.add_argument("--address", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--show", action="store_true", help="open the page in a web browser")
    p.add_argument("--no-basemap", action="store_true",
                   help="no basemap tiles, for offline use (the page then makes no request outside this server)")
    p.add_argument("--polygons", metavar="PATH",
                   help="polygon file (counties, tracts, GeoJSON/shapefile/GeoParquet) for an area summary table")
    p.set_defaults(handler=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    import os
    import subprocess
    from pathlib import Path

    from geodbk.errors import InputDataError
    from geodbk.viewer.catalog import check_run_folder

    app = Path(__file__).resolve().parents[2] / "apps" / "dashboard.py"
    if not app.exists():
        raise InputDataError(f"the dashboard app is not at {app}; serve from a source checkout (pip install -e .)")
    if not 0 < args.port < 65536:
        raise InputDataError(f"--port must be in 1..65535, got {args.port}")
    check_listen_address(args.address, args.port)
    runs = [str(Path(run).resolve()) for run in (args.run or ["outputs/demo"])]
    origins = {f"{host}:{args.port}" for host in (args.address, "127.0.0.1", "localhost")}
    cmd = [sys.executable, "-m", "panel", "serve", str(app), "--port", str(args.port), "--address", args.address]
    for origin in sorted(origins):
        cmd += ["--allow-websocket-origin", origin]
    if args.show:
        cmd.append("--show")
    cmd += ["--args"] + [item for run in runs for item in ("--run", run)]
    if args.no_basemap:
        cmd.append("--no-basemap")
    if args.polygons:
        from geodbk.ingest.regions import read_polygons

        read_polygons(args.polygons, what="polygon")  # refused here in one line, not on the page
        cmd += ["--polygons", str(Path(args.polygons).resolve())]
    for run in runs:
        check_run_folder(Path(run))  # refused here in one line, before the server starts
    print(f"geodbk serve: http://{args.address}:{args.port}/dashboard (Ctrl-C to stop)", file=sys.stderr, flush=True)
    if os.name == "posix":  # become the server, so that signals (Ctrl-C, kill) reach it directly
        os.execv(sys.executable, cmd)
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 0


def _add_demo(sub: argparse._SubParsersAction) -> None:
    from geodbk.dataset.protocols import PROTOCOLS

    # defaults live in geodbk.workflow.DemoConfig (not imported here: it pulls in torch);
    # an option left unset keeps the DemoConfig default named in its help
    p = sub.add_parser(
        "demo",
        help="the main job on the shipped Puerto Rico sample",
        description=(
            "Build the mobile download-speed dataset from the shipped Ookla sample, fit DBK-RBF, the "
            "SV-DKL baseline and the k-nearest-tiles baseline on space-time inputs, print the urban/rural "
            "test metrics (y = log10 Mbps) and write a run folder: dataset.parquet, models/<kind>.pt, "
            "metrics.csv/json, maps/<kind>.nc (every fitted quarter: mean, sd, 95% PI width, Mbps bounds, "
            "P(below the FCC benchmark); the change over the last year with its sd and P(increase); kernel "
            "slices), maps/<kind>.tif (the latest quarter) and maps/<kind>_test_tiles.geojson. "
            "The defaults finish in a few minutes on 2 CPU cores; --paper-size uses the paper's "
            "h=256, r=1024, 400 epochs (a GPU job). Open the result with `geodbk serve --run DIR`."
        ),
    )
    p.add_argument("--out", default="outputs/demo", metavar="DIR", help="run folder to write (default outputs/demo)")
    p.add_argument("--region", help="shipped sample region: PR, HI, or counties of them ('Kauai, HI', FIPS '15007', "
                   "joined by '+') (default PR)")
    p.add_argument("--target", choices=("download,upload", "download", "upload", "latency"),
                   help="speed-test measure (default download,upload). With both speeds, dbk-rbf models them "
                   "together and maps P(meets the FCC 35/3 pair); the other kinds model download")
    p.add_argument("--quarters", help="comma-separated quarters, e.g. 2023Q1,2023Q4 "
                   "(default all: the 19 complete quarters 2019Q1-2023Q4)")
    p.add_argument("--models", help="comma-separated model kinds to fit (default dbk-rbf,sv-dkl,knn)")
    p.add_argument("--protocol", choices=list(PROTOCOLS), help="model inputs (default space-time)")
    p.add_argument("--split", choices=("random", "spatial-block", "forecast"),
                   help="train/val/test protocol (default random)")
    add_block_option(p)
    p.add_argument("--quarter", help="map only this quarter, e.g. 2023Q1 (default: every fitted quarter along "
                   "a time dimension; the GeoTIFF has the latest)")
    add_map_options(p)
    add_extrapolation_option(p)
    p.add_argument("--epochs", type=int, help="training epochs per model (default 20 at lr 0.01, batch 1024; for "
                   "more rows the batch doubles, to at most 8192, and the lr grows by 1.41 while an epoch "
                   "keeps 25 steps, and the epochs pass at most 1.5 million rows)")
    p.add_argument("--resolution", help="map cell side in degrees, or e.g. 500m (default 0.005 degrees, about 550 m)")
    p.add_argument("--crs", help="CRS of the maps (default EPSG:4326; UTM for metre resolutions)")
    p.add_argument("--paper-size", action="store_true", help="paper model size and 400-epoch schedule")
    p.add_argument("--no-density", action="store_true",
                   help="coordinates and time only: do not give the models the shipped fixed-broadband "
                   "tiles' test density and speed (space-time protocol)")
    p.add_argument("--seed", type=int, help="seed of the split and the fits (default 0)")
    p.add_argument("--device", help="auto (CUDA if available), cpu or cuda (default auto)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.set_defaults(handler=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    import time

    from geodbk.errors import InputDataError
    from geodbk.models import available_models
    from geodbk.workflow import DemoConfig, run_demo

    # every check runs before the minutes of fitting, not when the maps are drawn
    if args.no_threshold:
        raise InputDataError("the demo always maps P(below the benchmark); give --threshold MBPS to change it")
    check_map_options(args)
    check_split_options(args)
    if args.device is not None:
        check_device(args.device, allow_auto=True)
    if args.epochs is not None and args.epochs < 1:
        raise InputDataError(f"--epochs must be >= 1, got {args.epochs}")
    given: dict = {
        "region": args.region,
        "target": args.target,
        "epochs": args.epochs,
        "resolution": args.resolution,
        "map_crs": args.crs,
        "seed": args.seed,
        "device": args.device,
        "protocol": args.protocol,
        "split": args.split,
        "block_m": block_metres(args),
        "map_quarter": None if args.quarter is None else parse_quarter(args.quarter),
        "max_distance": args.max_distance,
        "change": parse_change(args.change),
        "threshold": args.threshold,
    }
    if args.models is not None:
        given["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
        unknown = [m for m in given["models"] if m not in available_models()]
        if not given["models"] or unknown:
            raise InputDataError(f"unknown or no model kinds {unknown} in --models; "
                                 f"known: {', '.join(available_models())}")
    if args.quarters is not None:
        text = args.quarters.strip()
        given["quarters"] = None if text.lower() == "all" else parse_quarter_list(text)
    config = DemoConfig(
        **{k: v for k, v in given.items() if v is not None or k == "quarters"},
        paper_size=args.paper_size,
        density=not args.no_density,
        progress=not args.no_progress,
    )
    _check_demo_maps(config, allow=args.allow_extrapolation)
    start = time.perf_counter()
    result = run_demo(args.out, config, overwrite=args.overwrite)
    print(f"done in {time.perf_counter() - start:.0f} s: {len(result.files)} files in {result.run.root}")
    return 0


def _check_demo_maps(config: Any, *, allow: bool) -> None:
    """Before any fitting, refuse what ``geodbk predict`` would refuse of the demo's maps: a grid
    too large to hold, a grid with no cell inside the region, a change of a quarter to itself,
    and (unless ``allow``) a map or change quarter too far from the quarters the models will be
    fitted on (:func:`geodbk.dataset.domain.quarter_report`)."""
    import numpy as np
    import pandas as pd

    from geodbk.dataset.domain import quarter_report
    from geodbk.dataset.protocols import get_protocol
    from geodbk.dataset.spatial_dataset import parse_quarters, sample_tiles_path
    from geodbk.dataset.splits import fitted_quarters
    from geodbk.dataset.targets import parse_targets
    from geodbk.errors import InputDataError
    from geodbk.ingest.regions import load_region
    from geodbk.maps.geometry import RegularGrid
    from geodbk.maps.schema import GridLayers, check_cells_inside, check_change, check_grid_size
    from geodbk.maps.thresholds import Benchmark
    from geodbk.quarters import Quarter

    pairs = parse_quarters(list(config.quarters)) if config.quarters else None
    if pairs is None:
        keys = pd.read_parquet(sample_tiles_path(config.region), columns=["year", "quarter"]).drop_duplicates()
        pairs = list(keys.itertuples(index=False, name=None))
    quarters = [Quarter(int(y), int(q)) for y, q in sorted(set(pairs))]
    refs = ("urban", "rural", "wildland")
    pair = Benchmark(1.0, 1.0) if len(parse_targets(config.target)) == 2 else None
    layers = GridLayers(parse_targets(config.target)[0], "", tuple(quarters), len(quarters) > 1, 1.0,
                        (quarters[0], quarters[-1]), refs,
                        np.zeros((3, 2)), pair, "upload" if pair else None)
    grid = RegularGrid.over(load_region(config.region), config.resolution, crs=config.map_crs)
    check_grid_size(grid, layers.values_per_cell(), lift="map it with geodbk predict --max-cells")
    check_cells_inside(grid)
    if config.change is not None:
        check_change(*config.change)
    asked = [q for q in (config.map_quarter, *(config.change or ())) if q is not None]
    if not get_protocol(config.protocol).space_time or not asked:  # a time-free model maps any quarter
        return
    fitted = fitted_quarters(quarters, config.split)  # what ModelInfo.fitted_quarters will say
    problem = quarter_report(fitted, asked, kind="demo's", region=config.region).problem()
    if problem is not None and not allow:
        raise InputDataError(f"{problem}; pass --allow-extrapolation to map it anyway")

