"""``geodbk predict`` (model -> grid), ``export`` (grid -> GeoTIFF/NetCDF/Zarr, fit -> test tiles) and
``summarize`` (model -> polygon or H3 hexagon averages).

``predict`` and ``summarize`` refuse an area mostly outside the model's fitted extent, or
quarters beyond its forecast allowance, unless given ``--allow-extrapolation``
(``predict``: :meth:`geodbk.maps.plan.MapPlan.check`, with every other refusal of its map;
``summarize``: :func:`geodbk.cli.options.check_domain`).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from geodbk.cli.options import (
    EXTRAPOLATION_LIFT,
    add_extrapolation_option,
    add_map_options,
    check_device,
    check_domain,
    check_map_options,
    finite_float,
    parse_change,
    parse_quarter,
    parse_quarter_list,
    threshold_option,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from geodbk.quarters import Quarter

#: float32-sized values a polygon summary holds per averaging cell: lon and lat (float64),
#: polygon, weight, and the prediction's mean and sd.
SUMMARY_VALUES_PER_CELL = 8


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
    p.add_argument("--region",
                   help="state, counties ('Kauai, HI', '15007', joined by '+') or polygon file "
                   "(default: the region the model was fitted on)")
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
    add_map_options(p)
    add_extrapolation_option(p)
    p.add_argument("--chunk-rows", type=int, metavar="N", help="grid rows per block (default: ~262k cells per block)")
    p.add_argument("--max-cells", type=int, metavar="N",
                   help="largest grid accepted, in cells (default: what 4 GiB of float32 values hold, e.g. "
                   "153 million cells for one quarter's 7 layers)")
    p.add_argument("--device", default="cpu", help="torch device for the model (default cpu)")
    p.add_argument("--precision", choices=("float32", "tf32", "bf16"), default="float32",
                   help="precision of the model's backbone (default float32); tf32 (CUDA tensor cores) errs by "
                   "at most ~0.002 in log10 speed and 0.5%% in sd, bf16 by ~0.016 and 4%% (measured on the PR demo "
                   "model; features and variance stay float32)")
    p.add_argument("--dask-scheduler", metavar="ADDRESS|local|local:N",
                   help="predict the row blocks in parallel on a Dask cluster: a scheduler address "
                   "(tcp://host:8786), or 'local' / 'local:N' for N single-threaded worker processes on "
                   "this machine (default 2); workers write their blocks straight into --out, which must "
                   "then be a .zarr store on a filesystem they all see")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(handler=_run_predict)


def _run_predict(args: argparse.Namespace) -> int:
    import time
    from dataclasses import replace

    from geodbk.dataset.spatial_dataset import SpatialDataset
    from geodbk.errors import InputDataError
    from geodbk.fit.geomodel import GeoModel
    from geodbk.ingest.regions import load_region
    from geodbk.maps.plan import check_store
    from geodbk.maps.reference import parse_refs, reference_points
    from geodbk.maps.schema import grid_size_limit

    if args.dask_scheduler is not None:
        from geodbk.maps.parallel import check_scheduler

        check_scheduler(args.dask_scheduler)
    # before the model loads: the output (which may not hold the inputs) and the device
    inputs = [args.model, *([args.dataset] if args.dataset else [])]
    check_store(args.out, parallel=args.dask_scheduler is not None, name="--out", inputs=inputs)
    check_device(args.device)
    quarters: str | Quarter | list[Quarter] = "latest" if args.quarter is None else parse_quarter(args.quarter)
    if args.quarters is not None:
        quarters = "all" if args.quarters.strip().lower() == "all" else parse_quarter_list(args.quarters)
    change = parse_change(args.change)
    check_map_options(args)
    if args.chunk_rows is not None and args.chunk_rows < 1:
        raise InputDataError(f"--chunk-rows must be >= 1, got {args.chunk_rows}")
    if args.max_cells is not None and args.max_cells < 1:
        raise InputDataError(f"--max-cells must be >= 1, got {args.max_cells}")
    model = GeoModel.load(args.model, device=args.device)
    model.regressor.prediction_precision = args.precision
    refs = parse_refs(args.ref)
    plan = replace(model.plan(
        args.resolution, load_region(args.region) if args.region else None, quarters, change, crs=args.crs,
        allow_extrapolation=args.allow_extrapolation, refs=refs or None, threshold=threshold_option(args),
        max_distance=args.max_distance, chunk_rows=args.chunk_rows, store=args.out, progress=not args.no_progress,
        client=args.dask_scheduler,
    ), domain_lift=EXTRAPOLATION_LIFT)
    with grid_size_limit(args.max_cells):
        if not refs and args.dataset:  # the reference search walks the grid's cells: check the plan first
            plan.check()
            plan = plan.with_refs(reference_points(SpatialDataset.load(args.dataset), plan.grid))
        print(plan.describe())  # what is asked, before grid checks it (a refusal follows on stderr)
        start = time.perf_counter()
        model.grid(plan).close()
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
                   help="GeoTIFF bands, in order (default: all variables; kernel_slice gives one band per "
                   "reference point)")
    g.add_argument("--nodata", type=float, default=None, help="GeoTIFF nodata value (default -9999)")
    g.add_argument("--netcdf", metavar="PATH", help="copy the grid to NetCDF-4")
    g.add_argument("--zarr", metavar="PATH", help="copy the grid to a Zarr store")
    t = p.add_argument_group("test-tile outputs")
    t.add_argument("--model", metavar="PATH", help="fitted model file (RUN/models/<kind>.pt)")
    t.add_argument("--dataset", metavar="PATH", help="its dataset (RUN/dataset.parquet)")
    t.add_argument("--test-tiles", metavar="PATH", help="write the tiles here: *.geojson or *.parquet (GeoParquet)")
    t.add_argument("--split", default="test", choices=("train", "val", "test"),
                   help="which split's tiles (default test)")
    t.add_argument("--benchmark", metavar="D/U",
                   help="download/upload Mbps pair of a two-target model's p_meets columns, e.g. 35/3, 5/1, 7/1, "
                   "100/20, 25/3 (default: the service's FCC pair, 35/3 mobile, 100/20 fixed)")
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
    _check_export_outputs(args)
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
        from geodbk.fit.geomodel import GeoModel
        from geodbk.io.vectors import write_tile_predictions

        model = GeoModel.load(args.model)
        dataset = SpatialDataset.load(args.dataset)
        written = write_tile_predictions(model, dataset, args.test_tiles, split=args.split, benchmark=args.benchmark)
        print(f"wrote {written}")
    return 0


def _check_export_outputs(args: argparse.Namespace) -> None:
    """Every output of ``geodbk export``, before any is written: none is an input or holds one,
    each replaces only its own kind of thing (:func:`geodbk.fileio.check_output`), and no two
    are at one path (:func:`geodbk.fileio.check_distinct`)."""
    from geodbk.fileio import ZARR_STORE, check_distinct, check_output

    inputs = [path for path in (args.grid, args.model, args.dataset) if path]
    outputs = (("--geotiff", args.geotiff, None), ("--netcdf", args.netcdf, None), ("--zarr", args.zarr, ZARR_STORE),
               ("--test-tiles", args.test_tiles, None))
    for flag, path, kind in outputs:
        if path:
            check_output(path, kind=kind, inputs=inputs, name=flag)
    check_distinct({flag: path for flag, path, _ in outputs})


def _add_summarize(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "summarize",
        help="average a fitted model's speed over polygons (counties, tracts, ...) or H3 hexagons with exact "
        "uncertainty",
        description=(
            "For each polygon: the area mean of the tile-mean log10 speed over grid cells inside it and its "
            "sd from the joint posterior (not the mean of the cell sds), the geometric-mean speed with a 95% "
            "interval, the expected share of the area below the speed benchmark, and the number of observed "
            "(training) tiles inside. Polygons keep their columns and CRS. By default only polygons that "
            "overlap the model's region are kept. Polygons are summarised in blocks of whole polygons of about "
            "262k cells, so memory follows the largest polygon, not the number of polygons; the largest polygon's "
            "joint covariance is planned first and printed, and a polygon whose plan is above 2 GiB (about 9,000 "
            "averaging cells) is refused with a coarser --resolution to use. "
            "With --h3 instead of --polygons: one row per H3 hexagon (the FCC's mobile map cells) whose centre "
            "is in the model's region, with each target's hexagon mean and joint sd, and the chance that the "
            "hexagon mean meets the --benchmark (geodbk.decisions.hexagon_summary lists the columns)."
        ),
        epilog="examples: geodbk summarize --model outputs/demo/models/dbk-rbf.pt "
        "--polygons data/cb_2018_us_county_20m.zip --quarter 2023Q4 --out pr_municipios.parquet; "
        "geodbk summarize --model outputs/demo/models/dbk-rbf.pt --h3 9 --out pr_hexagons.parquet",
    )
    p.add_argument("--model", required=True, metavar="PATH", help="fitted model file (a GP kind, e.g. dbk-rbf)")
    areas = p.add_mutually_exclusive_group(required=True)
    areas.add_argument("--polygons", metavar="PATH",
                       help="polygon file: GeoJSON, shapefile (zip), GeoPackage or GeoParquet, any CRS")
    areas.add_argument("--h3", type=int, nargs="?", const=9, metavar="RES",
                       help="H3 hexagons of resolution RES, 5 to 10, over the model's region (default 9, the "
                       "FCC's mobile map cells, about 0.1 km^2)")
    p.add_argument("--out", required=True, metavar="PATH", help="output: *.parquet (GeoParquet), *.geojson or *.csv")
    p.add_argument("--quarter", help="quarter, e.g. 2023Q4 (default: the model's latest fitted quarter)")
    p.add_argument("--resolution", default=None,
                   help="side of the averaging cells: degrees, or e.g. 500m (default 0.005 degrees, about one tile)")
    level = p.add_mutually_exclusive_group()
    level.add_argument("--threshold", type=finite_float, metavar="MBPS",
                       help="benchmark of share_below (default: FCC 35/3 Mbps mobile, 100/20 fixed)")
    level.add_argument("--no-threshold", action="store_true", help="leave share_below out")
    p.add_argument("--all-polygons", action="store_true",
                   help="keep polygons that do not overlap the model's region (they are extrapolation)")
    p.add_argument("--max-cells", type=int, metavar="N",
                   help="most averaging cells accepted over the polygons (default: what 4 GiB holds)")
    p.add_argument("--dask-scheduler", metavar="ADDRESS|local|local:N",
                   help="summarise the blocks of polygons in parallel on a Dask cluster: a scheduler address "
                   "(tcp://host:8786), or 'local' / 'local:N' for N single-threaded worker processes on this "
                   "machine (default 2); the model goes to each worker once, and the table is the serial one")
    p.add_argument("--benchmark", metavar="D/U",
                   help="with --h3: download/upload Mbps pair of p_meets and share_meets, e.g. 35/3, 5/1, 7/1, "
                   "100/20, 25/3 (default: the service's FCC pair, 35/3 mobile, 100/20 fixed)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_extrapolation_option(p)
    p.set_defaults(handler=_run_summarize)


def _run_summarize(args: argparse.Namespace) -> int:
    import time

    from geodbk.errors import InputDataError
    from geodbk.fileio import check_output
    from geodbk.fit.geomodel import GeoModel
    from geodbk.ingest.regions import read_polygons
    from geodbk.maps.geometry import RegularGrid
    from geodbk.maps.schema import check_grid_size, grid_size_limit
    from geodbk.maps.summaries import (
        DEFAULT_RESOLUTION,
        SUMMARY_FORMATS,
        plan_summary,
        polygons_in_region,
        summarize_polygons,
        write_summary,
    )

    if not args.out.lower().endswith(SUMMARY_FORMATS):
        raise InputDataError(f"--out must end in one of {', '.join(SUMMARY_FORMATS)}, got {args.out}")
    if args.h3 is not None:
        return _summarize_hexagons(args)
    if args.benchmark is not None:
        raise InputDataError("--benchmark goes with --h3; polygons take --threshold")
    check_output(args.out, inputs=[args.model, args.polygons], name="--out")
    quarter = None if args.quarter is None else parse_quarter(args.quarter)
    check_map_options(args)
    if args.max_cells is not None and args.max_cells < 1:
        raise InputDataError(f"--max-cells must be >= 1, got {args.max_cells}")
    if args.dask_scheduler is not None:
        from geodbk.maps.parallel import check_scheduler

        check_scheduler(args.dask_scheduler)
    model = GeoModel.load(args.model)
    polygons = read_polygons(args.polygons, what="polygon", keep_crs=True)
    if not args.all_polygons:
        # the fitted polygon, not the region's name: a region read from a file is named by its stem
        kept = polygons_in_region(polygons, model.fitted_region().geometry)
        if len(kept) == 0:
            raise InputDataError(f"no polygon in {args.polygons} overlaps the model's region {model.info.region}")
        print(f"kept {len(kept)} of {len(polygons)} polygons that overlap {model.info.region}")
        polygons = kept
    area = polygons.to_crs(4326).union_all()
    check_domain(model, area, quarter or "latest", allow=args.allow_extrapolation)
    resolution = args.resolution or DEFAULT_RESOLUTION
    with grid_size_limit(args.max_cells):  # the averaging cells, before they are allocated
        check_grid_size(RegularGrid.over(area, resolution), SUMMARY_VALUES_PER_CELL)
    plan = plan_summary(polygons, resolution)  # the largest polygon's joint variance, before it is summed
    print(plan.describe())
    start = time.perf_counter()
    summary = summarize_polygons(
        model, polygons, time=quarter, plan=plan, threshold=threshold_option(args), client=args.dask_scheduler,
        progress=not args.no_progress,
    )
    write_summary(summary, args.out)
    print(f"wrote {args.out}: {len(summary)} polygons, quarter {summary['quarter'].iloc[0]}, "
          f"{int(summary['cells'].sum())} cells, in {time.perf_counter() - start:.1f} s")
    return 0


def _summarize_hexagons(args: argparse.Namespace) -> int:
    """``geodbk summarize --h3``: :func:`geodbk.decisions.hexagon_summary.summarize_hexagons` of the
    model's region, written with :func:`geodbk.maps.summaries.write_summary`."""
    import time

    from geodbk.decisions.hexagon_summary import summarize_hexagons
    from geodbk.errors import InputDataError
    from geodbk.fileio import check_output
    from geodbk.fit.geomodel import GeoModel
    from geodbk.maps.hexagons import check_resolution
    from geodbk.maps.summaries import write_summary
    from geodbk.maps.thresholds import Benchmark

    polygon_only = [flag for flag, value in (
        ("--resolution", args.resolution), ("--threshold", args.threshold), ("--no-threshold", args.no_threshold),
        ("--all-polygons", args.all_polygons), ("--max-cells", args.max_cells),
        ("--dask-scheduler", args.dask_scheduler),
    ) if value not in (None, False)]
    if polygon_only:
        raise InputDataError(f"{', '.join(polygon_only)} go with --polygons, not --h3")
    resolution = check_resolution(args.h3)
    benchmark = None if args.benchmark is None else Benchmark.parse(args.benchmark)
    check_output(args.out, inputs=[args.model], name="--out")
    quarter = None if args.quarter is None else parse_quarter(args.quarter)
    model = GeoModel.load(args.model)
    check_domain(model, model.fitted_region().geometry, quarter or "latest", allow=args.allow_extrapolation)
    start = time.perf_counter()
    summary = summarize_hexagons(model, resolution, quarter, benchmark, progress=not args.no_progress)
    write_summary(summary, args.out)
    print(f"wrote {args.out}: {len(summary)} resolution-{resolution} H3 hexagons, quarter "
          f"{summary['quarter'].iloc[0]}, in {time.perf_counter() - start:.1f} s")
    return 0
