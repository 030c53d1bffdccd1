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
    p.set_defaults(handler=_run_ingest)


def _run_ingest(args: argparse.Namespace) -> int:
    raise NotImplementedError("ingest")


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
