"""``geodbk`` command line: ingest, fit, predict, export, serve and the demo job.

Each subcommand is a thin wrapper over the public API; user errors
(:class:`geodbk.errors.GeodbkError`) are printed as one line with exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

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
    p.add_argument("--seed", type=int, default=0, help="seed of the 8:1:1 split")
    p.add_argument("--cache-dir", help="download cache folder")
    p.add_argument("--out", metavar="PATH", help="write the dataset here (GeoParquet)")
    p.set_defaults(handler=_run_ingest)


def _run_ingest(args: argparse.Namespace) -> int:
    from geodbk.dataset import build_dataset, sample_tiles_path
    from geodbk.errors import InputDataError
    from geodbk.ookla import ookla_url
    from geodbk.regions import DEFAULT_BUFFER_DEG

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


# --- fit --------------------------------------------------------------------------------
def _add_fit(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fit", help="fit a model to a dataset and report urban/rural metrics")
    p.set_defaults(handler=_run_fit)


def _run_fit(args: argparse.Namespace) -> int:
    raise NotImplementedError("fit")


# --- predict / export ---------------------------------------------------------------------
def _add_predict(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="rasterise a fitted model's predictions on a grid")
    p.set_defaults(handler=_run_predict)


def _run_predict(args: argparse.Namespace) -> int:
    raise NotImplementedError("predict")


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write GeoTIFF / GeoJSON / NetCDF / Zarr from a fit")
    p.set_defaults(handler=_run_export)


def _run_export(args: argparse.Namespace) -> int:
    raise NotImplementedError("export")


# --- serve ------------------------------------------------------------------------------
def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="open the interactive Panel dashboard")
    p.set_defaults(handler=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    raise NotImplementedError("serve")


# --- demo (the README's main job) -------------------------------------------------------------
def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the main job on the shipped Puerto Rico sample")
    p.set_defaults(handler=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    raise NotImplementedError("demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="geodbk",
        description="Deep Basis Kernel GP maps of mobile internet quality from Ookla tiles.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_ingest, _add_fit, _add_predict, _add_export, _add_serve, _add_demo):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except GeodbkError as err:
        print(f"geodbk {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
