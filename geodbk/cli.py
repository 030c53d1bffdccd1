"""``geodbk`` command line: ingest, fit, predict, export, serve and the demo job.

Each subcommand is a thin wrapper over the public API; user errors
(:class:`geodbk.errors.GeodbkError`) are printed as one line with exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Sequence

from geodbk.errors import GeodbkError

Handler = Callable[[argparse.Namespace], int]


# --- ingest -----------------------------------------------------------------------------
def _add_ingest(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ingest", help="build a dataset from Ookla tiles and print its summary")
    src = p.add_argument_group("tiles (default: the shipped mobile sample of --region, PR or HI)")
    src.add_argument("--tiles", nargs="+", metavar="PATH_OR_URL",
                     help="Ookla tile file(s): Parquet, GeoJSON, shapefile or zip; path or http(s) URL")
    src.add_argument("--service", choices=("mobile", "fixed"), default=None,
                     help="keep this service; with --year/--quarter, the Ookla file to download")
    src.add_argument("--year", type=int, help="download Ookla's global file of this year ...")
    src.add_argument("--quarter", type=int, choices=(1, 2, 3, 4), help="... and quarter")
    p.add_argument("--region", default="PR",
                   help="state name, USPS code or FIPS code, or a polygon file (default PR)")
    p.add_argument("--target", choices=("download", "upload", "latency"), default="download")
    p.add_argument("--quarters", help="comma-separated quarters to keep, e.g. 2023Q1,2023Q4 (default all)")
    p.add_argument("--urban-areas", metavar="PATH_OR_URL",
                   help="Census 2020 Urban Area polygons (default: county urban share)")
    p.add_argument("--urban-threshold", type=float, default=0.5,
                   help="county route: urban when the county urban population share >= this")
    p.add_argument("--buffer", type=float, default=None, metavar="DEG",
                   help="grow the region polygon by this many degrees before clipping (default 0.01)")
    _add_split_options(p)
    p.add_argument("--cache-dir", help="download cache folder")
    p.add_argument("--out", metavar="PATH", help="write the dataset here (GeoParquet)")
    p.set_defaults(handler=_run_ingest)


def _run_ingest(args: argparse.Namespace) -> int:
    from geodbk.dataset.spatial_dataset import build_dataset, sample_tiles_path
    from geodbk.errors import InputDataError
    from geodbk.ingest.ookla import ookla_url
    from geodbk.ingest.regions import DEFAULT_BUFFER_DEG

    if args.tiles and (args.year or args.quarter):
        raise InputDataError("give either --tiles or --year/--quarter, not both")
    if args.tiles:
        tiles = args.tiles
    elif args.year or args.quarter:
        if not (args.year and args.quarter and args.service):
            raise InputDataError("downloading Ookla's file needs --service, --year and --quarter")
        tiles = [ookla_url(args.service, args.year, args.quarter)]
    else:
        tiles = [sample_tiles_path(args.region)]
    dataset = build_dataset(
        tiles if len(tiles) > 1 else tiles[0],
        args.region,
        target=args.target,
        quarters=args.quarters,
        seed=args.seed,
        split=args.split or "random",
        block_m=1000.0 * args.block_km,
        urban_areas=args.urban_areas,
        urban_threshold=args.urban_threshold,
        service=args.service,
        buffer_deg=DEFAULT_BUFFER_DEG if args.buffer is None else args.buffer,
        cache_dir=args.cache_dir,
    )
    print(dataset.summary())
    if args.out:
        print(f"wrote {dataset.save(args.out)}")
    return 0


def _add_split_options(p: argparse.ArgumentParser, *, keep: bool = False) -> None:
    default = "the dataset's own split" if keep else "random"
    p.add_argument("--split", choices=("random", "spatial-block", "forecast"),
                   help=f"train/val/test protocol (default: {default}). random: 8:1:1 over (tile, quarter) rows, "
                   "so a test tile's other quarters can be in training (optimistic); spatial-block: whole "
                   "blocks of --block-km held out (unseen places); forecast: test on the last quarter")
    p.add_argument("--block-km", type=float, default=10.0, help="block side of the spatial-block split, km (default 10)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split (and of the fits) (default 0)")


# --- fit --------------------------------------------------------------------------------
def _add_fit(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fit",
        help="fit models to a dataset and report urban/rural metrics",
        description=(
            "Fit one or more model kinds to a dataset file (written by `geodbk ingest` or the demo) on its "
            "train split, keep the weights with the best validation NLL, and write RUN/models/<kind>.pt "
            "and RUN/metrics.csv/json (test-split metrics overall, urban and rural; y = log10 value). "
            "Rows of models fitted earlier into the same RUN are kept. The default space-time protocol "
            "feeds the models equal-area coordinates scaled by the data's extent plus time in years, with "
            "a positional encoding and noise sigma0^2 + sigma1^2/tests; --protocol paper replicates the "
            "paper (region-box coordinates, no time, one noise). CPU-sized defaults (the default models "
            "on the full Puerto Rico sample in minutes on 2 cores): h=64, r=128, 40 epochs of batch 1024 "
            "at lr 1e-2; --paper-size: the paper's h=256, r=1024, 400 epochs, lr 1e-3 (explicit flags win)."
        ),
        epilog="example: geodbk fit --dataset outputs/demo/dataset.parquet --models dbk-rbf,knn "
        "--split spatial-block --out runs/pr-blocks",
    )
    p.add_argument("--dataset", required=True, metavar="PATH", help="dataset file (GeoParquet from geodbk)")
    p.add_argument("--out", required=True, metavar="RUN", help="run folder to write")
    p.add_argument("--models", default="dbk-rbf,sv-rbf,sv-dkl,knn",
                   help="comma-separated model kinds (default dbk-rbf,sv-rbf,sv-dkl,knn); known: dbk-rbf, "
                   "dbk-silu, exact-dbk, sv-rbf, sv-dkl, pp-dkl, vbll, dnn, knn and registered extras")
    p.add_argument("--protocol", choices=("space-time", "paper"), default="space-time",
                   help="model inputs (default space-time; paper: region box, no time, one noise)")
    p.add_argument("--no-test-noise", action="store_true",
                   help="one noise variance instead of sigma0^2 + sigma1^2/tests (space-time protocol)")
    p.add_argument("--encoding-scales", type=int,
                   help="wavelengths of the positional encoding (default 8; 0 = none; paper protocol: 0)")
    p.add_argument("--min-wavelength", type=float, default=None, metavar="METRES",
                   help="shortest positional-encoding wavelength, metres (default 1000, about 2 tiles)")
    p.add_argument("--epochs", type=int, help="maximum training epochs (default 40; 400 with --paper-size)")
    p.add_argument("--hidden", type=int, help="backbone width h (default 64; 256 with --paper-size)")
    p.add_argument("--rank", type=int, help="basis rank / inducing points r (default 128; 1024 with --paper-size)")
    p.add_argument("--paper-size", action="store_true", help="the paper's h=256, r=1024, 400 epochs, lr 1e-3")
    p.add_argument("--lr", type=float, help="AdamW learning rate (default 1e-2; 1e-3 with --paper-size)")
    p.add_argument("--batch-size", type=int, help="mini-batch size (default 1024)")
    p.add_argument("--patience", type=int, default=50,
                   help="stop after this many epochs without a better validation NLL (default 50)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="default float32")
    p.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda or cuda:N")
    _add_split_options(p, keep=True)
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.set_defaults(handler=_run_fit)


def _run_fit(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    import pandas as pd

    from geodbk.dataset.spatial_dataset import SpatialDataset
    from geodbk.errors import InputDataError
    from geodbk.fit.geomodel import MIN_WAVELENGTH_M, fit_dataset, map_model_config
    from geodbk.fit.metrics import format_metrics_table, metrics_table, save_metrics
    from geodbk.models import available_models
    from geodbk.models.config import run_preset
    from geodbk.workflow import RunFolder, evaluate_on_test

    kinds = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in available_models()]
    if not kinds or unknown:
        raise InputDataError(f"unknown or no model kinds {unknown}; known: {', '.join(available_models())}")
    for flag in ("epochs", "hidden", "rank", "batch_size", "patience"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise InputDataError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    if args.lr is not None and not args.lr > 0:
        raise InputDataError(f"--lr must be positive, got {args.lr}")
    if args.encoding_scales is not None and args.encoding_scales < 0:
        raise InputDataError(f"--encoding-scales must be >= 0, got {args.encoding_scales}")
    if args.min_wavelength is not None and not args.min_wavelength > 0:
        raise InputDataError(f"--min-wavelength must be positive metres, got {args.min_wavelength}")
    preset = run_preset("paper" if args.paper_size else "cpu")
    size, train_config = preset.configs(
        hidden=args.hidden, rank=args.rank, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
        patience=args.patience, seed=args.seed, device=args.device, progress=not args.no_progress,
    )
    overrides: dict[str, Any] = {"hidden": size.hidden, "rank": size.rank}
    if args.encoding_scales is not None:
        overrides["encoding_scales"] = args.encoding_scales
    if args.no_test_noise:
        overrides["test_noise"] = False
    model_config = map_model_config(args.protocol, dtype=args.dtype, **overrides)
    dataset = SpatialDataset.load(args.dataset)
    if args.split is not None:
        dataset = dataset.with_split(args.split, seed=args.seed, block_m=1000.0 * args.block_km)
    run = RunFolder(Path(args.out))
    if not run.dataset.exists():
        dataset.save(run.dataset)
    print(f"{args.protocol} protocol, {dataset.split_protocol} split: "
          + ", ".join(f"{s} {int((dataset.frame['split'] == s).sum()):,}" for s in ("train", "val", "test")))
    results = {}
    for kind in kinds:
        start = time.perf_counter()
        model = fit_dataset(
            dataset, kind, protocol=args.protocol, model_config=model_config, train_config=train_config,
            min_wavelength_m=MIN_WAVELENGTH_M if args.min_wavelength is None else args.min_wavelength,
        )
        model.save(run.model(kind))
        results[kind] = evaluate_on_test(model, dataset)
        print(f"{kind}: best epoch {model.regressor.best_epoch}/{len(model.regressor.history)}, "
              f"{time.perf_counter() - start:.0f} s")
    table = metrics_table(results)
    if run.metrics_csv.exists():  # keep rows of models fitted earlier into this run
        earlier = pd.read_csv(run.metrics_csv)
        table = pd.concat([earlier[~earlier["model"].isin(kinds)], table], ignore_index=True)
    save_metrics(table, run.root)
    print(format_metrics_table(table))
    return 0


# --- predict / export ---------------------------------------------------------------------
def _add_predict(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict",
        help="rasterise a fitted model's predictions on a grid (NetCDF or Zarr)",
        description=(
            "Predict a fitted model on a regular grid over a region and write an xarray dataset with "
            "mean, sd and pi_width (95%) of y = log10(value) (units log10(Mbps), or log10(ms) for "
            "latency), mean/lower/upper in Mbps (10**(mean -/+ 1.96 sd)) and optional kernel slices. "
            "Cells outside the region polygon are NaN and not predicted. The grid is filled in row "
            "blocks written straight to the output, so memory stays flat for any grid size."
        ),
        epilog="example: geodbk predict --model outputs/demo/models/dbk-rbf.pt --region PR "
        "--resolution 0.01 --out pr.nc --ref sanjuan:-66.06,18.45",
    )
    p.add_argument("--model", required=True, metavar="PATH", help="fitted model file, e.g. RUN/models/dbk-rbf.pt")
    p.add_argument("--out", required=True, metavar="PATH", help="output grid: *.nc (NetCDF-4) or *.zarr (Zarr store)")
    p.add_argument("--region", help="state name, USPS code or polygon file (default: the region the model was fitted on)")
    p.add_argument("--resolution", default="0.01",
                   help="cell side: a number in CRS units (degrees for EPSG:4326), or with a unit: "
                   "0.01deg, 500m, 2km (default 0.01 degrees, about 1.1 km)")
    p.add_argument("--crs", help="CRS of the grid, e.g. EPSG:32161 (default EPSG:4326; with a metre "
                   "resolution the region's UTM zone)")
    p.add_argument("--ref", action="append", default=[], metavar="NAME:LON,LAT",
                   help="reference point for a kernel_slice layer, in degrees; repeat for more")
    p.add_argument("--dataset", metavar="PATH",
                   help="dataset (RUN/dataset.parquet) to choose urban, rural and wildland reference "
                   "points automatically when no --ref is given")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--quarter", help="quarter to map, e.g. 2023Q4 (default: the model's latest fitted quarter; "
                      "one quarter later is allowed and flagged as extrapolation)")
    when.add_argument("--quarters", metavar="Q1,Q2,...|all",
                      help="several quarters along a CF time dimension, e.g. 2022Q4,2023Q4, or 'all' fitted quarters")
    _add_map_options(p)
    p.add_argument("--chunk-rows", type=int, metavar="N", help="grid rows per block (default: ~262k cells per block)")
    p.add_argument("--device", default="cpu", help="torch device for the model (default cpu)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(handler=_run_predict)


def _add_map_options(p: argparse.ArgumentParser) -> None:
    """--change, --threshold/--no-threshold and --max-distance (predict and demo)."""
    p.add_argument("--change", metavar="FROM:TO",
                   help="add change layers between two quarters, e.g. 2022Q4:2023Q4: mean change, its "
                   "joint-posterior sd, P(increase) and the change of the median in Mbps (GP models)")
    level = p.add_mutually_exclusive_group()
    level.add_argument("--threshold", type=float, metavar="MBPS",
                       help="p_below layer: P(tile-mean speed < MBPS) (default: the FCC benchmark, "
                       "35/3 Mbps down/up for mobile tiles, 100/20 for fixed; none for latency)")
    level.add_argument("--no-threshold", action="store_true", help="leave the p_below layer out")
    p.add_argument("--max-distance", type=float, metavar="METRES",
                   help="leave cells farther than this from any training tile empty (default: no limit)")


def _parse_change(text: str | None) -> tuple[str, str] | None:
    """``"2022Q4:2023Q4"`` -> ``("2022Q4", "2023Q4")`` (checked), or None."""
    from geodbk.errors import InputDataError
    from geodbk.dataset.inputs import parse_time

    if text is None:
        return None
    start, sep, end = text.partition(":")
    if not sep or not start.strip() or not end.strip():
        raise InputDataError(f"--change takes FROM:TO quarters, e.g. 2022Q4:2023Q4; got {text!r}")
    pair = (start.strip().upper(), end.strip().upper())
    for quarter in pair:
        parse_time(quarter)
    return pair


def _threshold(args: argparse.Namespace) -> float | str | None:
    from geodbk.maps.thresholds import DEFAULT

    return None if args.no_threshold else (DEFAULT if args.threshold is None else args.threshold)


def _run_predict(args: argparse.Namespace) -> int:
    import time

    from geodbk.dataset.spatial_dataset import SpatialDataset
    from geodbk.errors import InputDataError
    from geodbk.fit.geomodel import GeoModel
    from geodbk.maps.geometry import RegularGrid
    from geodbk.maps.predict import predict_grid
    from geodbk.maps.reference import parse_refs, reference_points
    from geodbk.dataset.inputs import parse_time
    from geodbk.ingest.regions import load_region

    if not args.out.endswith((".nc", ".zarr")):
        raise InputDataError(f"--out must end in .nc or .zarr, got {args.out}")
    if args.quarter is not None:
        parse_time(args.quarter)
    change = _parse_change(args.change)
    model = GeoModel.load(args.model, device=args.device)
    when: str | list[str] | None = args.quarter
    if args.quarters is not None:
        text = args.quarters.strip()
        when = list(model.meta.get("quarters") or []) if text.lower() == "all" else [
            q.strip().upper() for q in text.split(",") if q.strip()
        ]
        if not when:
            raise InputDataError(f"--quarters names no quarter (the model has {model.meta.get('quarters')})")
    region_spec = args.region or model.meta.get("region")
    if not region_spec:
        raise InputDataError("the model file names no region; pass --region")
    grid = RegularGrid.over(load_region(region_spec), args.resolution, crs=args.crs)
    refs = parse_refs(args.ref)
    if not refs and args.dataset:
        refs = reference_points(SpatialDataset.load(args.dataset), grid)
    shown = ",".join(when) if isinstance(when, list) else (when or model.latest_quarter or "all fitted quarters pooled")
    print(f"grid: {grid.height} x {grid.width} cells of {grid.resolution:g} in {grid.crs.to_string()}, "
          f"quarter(s) {shown}" + (f"; change {change[0]} -> {change[1]}" if change else "")
          + (f"; kernel slices at {', '.join(refs)}" if refs and model.has_kernel else ""))
    start = time.perf_counter()
    ds = predict_grid(model, grid, refs=refs or None, time=when, change=change, threshold=_threshold(args),
                      max_distance=args.max_distance, chunk_rows=args.chunk_rows, store=args.out,
                      progress=not args.no_progress)
    ds.close()
    print(f"wrote {args.out} in {time.perf_counter() - start:.1f} s")
    return 0


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write GeoTIFF / NetCDF / Zarr from a grid, or GeoJSON / GeoParquet test tiles from a fit",
        description=(
            "Two jobs. From a grid written by `geodbk predict` (--grid): a float32 GeoTIFF with one band "
            "per variable (band descriptions = variable names, nodata outside the region), optionally "
            "Cloud-Optimized (--cog), or a copy as NetCDF / Zarr. From a fitted model and its dataset "
            "(--model, --dataset): the test tiles with the observed value and the predictive mean, sd "
            "and 95% bounds in log10 and data units, the urban/rural label, quadkey and quarter."
        ),
        epilog="examples: geodbk export --grid pr.nc --geotiff pr.tif --cog\n"
        "          geodbk export --model RUN/models/dbk-rbf.pt --dataset RUN/dataset.parquet "
        "--test-tiles tiles.geojson",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("grid outputs")
    g.add_argument("--grid", metavar="PATH", help="grid from `geodbk predict` (*.nc or *.zarr)")
    g.add_argument("--geotiff", metavar="PATH", help="write a GeoTIFF here")
    g.add_argument("--cog", action="store_true", help="make the GeoTIFF a Cloud-Optimized GeoTIFF (tiled, overviews)")
    g.add_argument("--variables", nargs="+", metavar="NAME",
                   help="GeoTIFF bands, in order (default: all variables; kernel_slice gives one band per reference point)")
    g.add_argument("--nodata", type=float, default=None, help="GeoTIFF nodata value (default -9999)")
    g.add_argument("--netcdf", metavar="PATH", help="copy the grid to NetCDF-4")
    g.add_argument("--zarr", metavar="PATH", help="copy the grid to a Zarr store")
    t = p.add_argument_group("test-tile outputs")
    t.add_argument("--model", metavar="PATH", help="fitted model file (RUN/models/<kind>.pt)")
    t.add_argument("--dataset", metavar="PATH", help="its dataset (RUN/dataset.parquet)")
    t.add_argument("--test-tiles", metavar="PATH", help="write the tiles here: *.geojson or *.parquet (GeoParquet)")
    t.add_argument("--split", default="test", choices=("train", "val", "test"), help="which split's tiles (default test)")
    p.set_defaults(handler=_run_export)


def _run_export(args: argparse.Namespace) -> int:
    from geodbk.errors import InputDataError

    grid_outputs = [args.geotiff, args.netcdf, args.zarr]
    if any(grid_outputs) and not args.grid:
        raise InputDataError("--geotiff/--netcdf/--zarr need --grid")
    if not args.grid and not args.test_tiles:
        raise InputDataError("nothing to do: give --grid with --geotiff/--netcdf/--zarr, "
                             "or --model, --dataset and --test-tiles")
    if args.grid and not any(grid_outputs):
        raise InputDataError("--grid needs an output: --geotiff, --netcdf or --zarr")
    if args.test_tiles and not (args.model and args.dataset):
        raise InputDataError("--test-tiles needs --model and --dataset")
    if args.grid:
        from geodbk.io.cubes import write_netcdf, write_zarr
        from geodbk.io.geotiff import GEOTIFF_NODATA, write_geotiff
        from geodbk.maps.stores import open_grid

        ds = open_grid(args.grid)
        if args.geotiff:
            nodata = GEOTIFF_NODATA if args.nodata is None else args.nodata
            path = write_geotiff(ds, args.geotiff, variables=args.variables, cog=args.cog, nodata=nodata)
            print(f"wrote {path}")
        if args.netcdf:
            print(f"wrote {write_netcdf(ds, args.netcdf)}")
        if args.zarr:
            print(f"wrote {write_zarr(ds, args.zarr)}")
        ds.close()
    if args.test_tiles:
        from geodbk.dataset.spatial_dataset import SpatialDataset
        from geodbk.io.vectors import write_tile_predictions
        from geodbk.fit.geomodel import GeoModel

        model = GeoModel.load(args.model)
        dataset = SpatialDataset.load(args.dataset)
        print(f"wrote {write_tile_predictions(model, dataset, args.test_tiles, split=args.split)}")
    return 0


# --- summarize -------------------------------------------------------------------------
def _add_summarize(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "summarize",
        help="average a fitted model's speed over polygons (counties, tracts, ...) with exact uncertainty",
        description=(
            "For each polygon: the area mean of the tile-mean log10 speed over grid cells inside it and its "
            "sd from the joint posterior (not the mean of the cell sds), the geometric-mean speed with a 95% "
            "interval, the expected share of the area below the speed benchmark, and the number of observed "
            "(training) tiles inside. Polygons keep their columns and CRS. By default only polygons that "
            "overlap the model's region are kept."
        ),
        epilog="example: geodbk summarize --model outputs/demo/models/dbk-rbf.pt "
        "--polygons data/cb_2018_us_county_20m.zip --quarter 2023Q4 --out pr_municipios.parquet",
    )
    p.add_argument("--model", required=True, metavar="PATH", help="fitted model file (a GP kind, e.g. dbk-rbf)")
    p.add_argument("--polygons", required=True, metavar="PATH",
                   help="polygon file: GeoJSON, shapefile (zip), GeoPackage or GeoParquet, any CRS")
    p.add_argument("--out", required=True, metavar="PATH", help="output: *.parquet (GeoParquet), *.geojson or *.csv")
    p.add_argument("--quarter", help="quarter, e.g. 2023Q4 (default: the model's latest fitted quarter)")
    p.add_argument("--resolution", default=None,
                   help="side of the averaging cells: degrees, or e.g. 500m (default 0.005 degrees, about one tile)")
    level = p.add_mutually_exclusive_group()
    level.add_argument("--threshold", type=float, metavar="MBPS",
                       help="benchmark of share_below (default: FCC 35/3 Mbps mobile, 100/20 fixed)")
    level.add_argument("--no-threshold", action="store_true", help="leave share_below out")
    p.add_argument("--all-polygons", action="store_true",
                   help="keep polygons that do not overlap the model's region (they are extrapolation)")
    p.set_defaults(handler=_run_summarize)


def _run_summarize(args: argparse.Namespace) -> int:
    import time

    from geodbk.errors import InputDataError
    from geodbk.fit.geomodel import GeoModel
    from geodbk.dataset.inputs import parse_time
    from geodbk.ingest.regions import load_region, read_polygons
    from geodbk.maps.summaries import (
        DEFAULT_RESOLUTION,
        SUMMARY_FORMATS,
        polygons_in_region,
        summarize_polygons,
        write_summary,
    )

    if not args.out.lower().endswith(SUMMARY_FORMATS):
        raise InputDataError(f"--out must end in one of {', '.join(SUMMARY_FORMATS)}, got {args.out}")
    if args.quarter is not None:
        parse_time(args.quarter)
    model = GeoModel.load(args.model)
    polygons = read_polygons(args.polygons, what="polygon", keep_crs=True)
    if not args.all_polygons and model.meta.get("region"):
        kept = polygons_in_region(polygons, load_region(model.meta["region"]).geometry)
        if len(kept) == 0:
            raise InputDataError(f"no polygon in {args.polygons} overlaps the model's region {model.meta['region']}")
        print(f"kept {len(kept)} of {len(polygons)} polygons that overlap {model.meta['region']}")
        polygons = kept
    start = time.perf_counter()
    summary = summarize_polygons(
        model, polygons, time=args.quarter, resolution=args.resolution or DEFAULT_RESOLUTION, threshold=_threshold(args)
    )
    write_summary(summary, args.out)
    print(f"wrote {args.out}: {len(summary)} polygons, quarter {summary['quarter'].iloc[0]}, "
          f"{int(summary['cells'].sum())} cells, in {time.perf_counter() - start:.1f} s")
    return 0


# --- serve ------------------------------------------------------------------------------
def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="open the interactive Panel dashboard",
        description="Serve apps/dashboard.py with `panel serve` over one or more run folders "
        "(written by `geodbk demo`). Click the map to see the kernel slice and the predictive "
        "distribution at that point.",
        epilog="example: geodbk serve --run outputs/demo --port 5006 --show",
    )
    p.add_argument("--run", action="append", metavar="DIR",
                   help="run folder (repeat to compare runs, e.g. download and upload); default outputs/demo")
    p.add_argument("--port", type=int, default=5006, help="port to listen on (default 5006)")
    p.add_argument("--address", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--show", action="store_true", help="open the page in a web browser")
    p.add_argument("--offline", action="store_true",
                   help="no basemap tiles (the page then makes no request outside this server)")
    p.add_argument("--polygons", metavar="PATH",
                   help="polygon file (counties, tracts, GeoJSON/shapefile/GeoParquet) for an area summary table")
    p.set_defaults(handler=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    import os
    import subprocess
    from pathlib import Path

    from geodbk.errors import InputDataError

    app = Path(__file__).resolve().parents[1] / "apps" / "dashboard.py"
    if not app.exists():
        raise InputDataError(f"the dashboard app is not at {app}; serve from a source checkout (pip install -e .)")
    if not 0 < args.port < 65536:
        raise InputDataError(f"--port must be in 1..65535, got {args.port}")
    runs = [str(Path(run).resolve()) for run in (args.run or ["outputs/demo"])]
    origins = {f"{host}:{args.port}" for host in (args.address, "127.0.0.1", "localhost")}
    cmd = [sys.executable, "-m", "panel", "serve", str(app), "--port", str(args.port), "--address", args.address]
    for origin in sorted(origins):
        cmd += ["--allow-websocket-origin", origin]
    if args.show:
        cmd.append("--show")
    cmd += ["--args"] + [item for run in runs for item in ("--run", run)]
    if args.polygons:
        if not Path(args.polygons).exists():
            raise InputDataError(f"polygon file not found: {args.polygons}")
        cmd += ["--polygons", str(Path(args.polygons).resolve())]
    env = {**os.environ, **({"GEODBK_OFFLINE": "1"} if args.offline else {})}
    missing = [run for run in runs if not (Path(run) / "dataset.parquet").exists()]
    if missing:
        print(f"geodbk serve: no run folder at {', '.join(missing)}; build one with "
              "`geodbk demo --out outputs/demo` (the page says so too)", file=sys.stderr)
    print(f"geodbk serve: http://{args.address}:{args.port}/dashboard (Ctrl-C to stop)", file=sys.stderr, flush=True)
    if os.name == "posix":  # become the server, so that signals (Ctrl-C, kill) reach it directly
        os.execve(sys.executable, cmd, env)
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 0


# --- demo (the README's main job) -------------------------------------------------------------
def _add_demo(sub: argparse._SubParsersAction) -> None:
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
    p.add_argument("--region", choices=("PR", "HI"), help="shipped sample region (default PR)")
    p.add_argument("--target", choices=("download", "upload", "latency"), help="speed-test measure (default download)")
    p.add_argument("--quarters", help="comma-separated quarters, e.g. 2023Q1,2023Q4 "
                   "(default all: the 19 complete quarters 2019Q1-2023Q4)")
    p.add_argument("--models", help="comma-separated model kinds to fit (default dbk-rbf,sv-dkl,knn)")
    p.add_argument("--protocol", choices=("space-time", "paper"), help="model inputs (default space-time)")
    p.add_argument("--split", choices=("random", "spatial-block", "forecast"), help="train/val/test protocol (default random)")
    p.add_argument("--quarter", help="map only this quarter, e.g. 2023Q1 (default: every fitted quarter along "
                   "a time dimension; the GeoTIFF has the latest)")
    _add_map_options(p)
    p.add_argument("--epochs", type=int, help="training epochs per model (default 40 at lr 0.01, batch 1024)")
    p.add_argument("--resolution", help="map cell side in degrees, or e.g. 500m (default 0.005 degrees, about 550 m)")
    p.add_argument("--crs", help="CRS of the maps (default EPSG:4326; UTM for metre resolutions)")
    p.add_argument("--paper-size", action="store_true", help="paper model size and 400-epoch schedule")
    p.add_argument("--seed", type=int, help="seed of the split and the fits (default 0)")
    p.add_argument("--device", help="auto (CUDA if available), cpu or cuda (default auto)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.set_defaults(handler=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    import time

    from geodbk.errors import InputDataError
    from geodbk.workflow import DemoConfig, run_demo

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
        "map_quarter": args.quarter,
        "max_distance": args.max_distance,
        "change": _parse_change(args.change),
        "threshold": args.threshold,
    }
    if args.no_threshold:
        raise InputDataError("the demo always maps P(below the benchmark); give --threshold MBPS to change it")
    if args.models is not None:
        given["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
        if not given["models"]:
            raise InputDataError("--models names no model kind")
    if args.quarters is not None:
        text = args.quarters.strip()
        given["quarters"] = None if text.lower() == "all" else [q.strip() for q in text.split(",") if q.strip()]
    if args.epochs is not None and args.epochs < 1:
        raise InputDataError(f"--epochs must be >= 1, got {args.epochs}")
    config = DemoConfig(
        **{k: v for k, v in given.items() if v is not None or k == "quarters"},
        paper_size=args.paper_size,
        progress=not args.no_progress,
    )
    start = time.perf_counter()
    result = run_demo(args.out, config)
    print(f"done in {time.perf_counter() - start:.0f} s: {len(result.files)} files in {result.run.root}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="geodbk",
        description="Deep Basis Kernel GP maps of mobile internet quality from Ookla tiles.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_ingest, _add_fit, _add_predict, _add_summarize, _add_export, _add_serve, _add_demo):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import warnings

    args = build_parser().parse_args(argv)

    def one_line(message, category, filename, lineno, file=None, line=None) -> None:
        print(f"geodbk {args.command}: warning: {message}", file=sys.stderr)

    try:
        with warnings.catch_warnings():  # restores the default printer afterwards
            warnings.showwarning = one_line
            return args.handler(args)
    except GeodbkError as err:
        print(f"geodbk {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
