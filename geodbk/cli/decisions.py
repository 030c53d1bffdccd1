"""``geodbk update`` (new tests without a refit) and ``geodbk plan`` (where the next tests settle the most)."""

from __future__ import annotations

import argparse

from geodbk.cli.options import check_positive


def _add_update(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "update",
        help="condition a fitted model on new tiles without a refit",
        description=(
            "Add new Ookla tiles (this week's tests, a drive test) to a fitted GP model: each tile-quarter row "
            "enters the model's local residual field as a training row does at fit time, and maps, summaries "
            "and plans made from the new model file use it. The deep kernel, the field's kernel and the local "
            "volatility stay as fitted (`geodbk fit` re-chooses them). The tiles are clipped to the model's "
            "region and need every target the model predicts."
        ),
        epilog="example: geodbk update --model outputs/demo/models/dbk-rbf.pt --tiles new_tiles.parquet "
        "--out outputs/demo/models/dbk-rbf-updated.pt",
    )
    p.add_argument("--model", required=True, metavar="PATH", help="fitted model file (a GP kind, e.g. dbk-rbf)")
    p.add_argument("--tiles", required=True, nargs="+", metavar="PATH_OR_URL",
                   help="Ookla tile file(s) with the new tests: Parquet, GeoJSON, shapefile or zip")
    p.add_argument("--out", required=True, metavar="PATH", help="the updated model file (*.pt)")
    p.set_defaults(handler=_run_update)


def _run_update(args: argparse.Namespace) -> int:
    from geodbk.dataset.spatial_dataset import build_dataset
    from geodbk.fileio import check_output
    from geodbk.fit.geomodel import GeoModel

    check_output(args.out)
    model = GeoModel.load(args.model)
    tiles = args.tiles if len(args.tiles) > 1 else args.tiles[0]
    rows = build_dataset(tiles, model.fitted_region(), target=",".join(model.targets)).frame
    updated = model.condition(rows)
    updated.save(args.out)
    print(f"conditioned the {model.kind} model on {len(rows):,} new tile-quarter rows ({rows['tests'].sum():,} tests)")
    print(f"wrote {args.out}")
    return 0


def _add_plan(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="choose the H3 hexagons where the next speed tests settle the most benchmark decisions",
        description=(
            "Choose BUDGET visits of K tests each, among the H3 hexagons of the model's region, that most "
            "lower the expected number of hexagons whose benchmark decision (P(meets) above or below 1/2) "
            "is wrong: the sum of min(p, 1 - p). Each visit's effect is the exact preposterior of the "
            "model's joint Gaussian (tests not yet taken change the covariance in closed form, without "
            "their values), and the choice is greedy and batch-aware: after each pick the covariance is "
            "conditioned on it, so a visit that informs its neighbours lowers the value of visiting them."
        ),
        epilog="example: geodbk plan --model outputs/demo/models/dbk-rbf.pt --budget 25 --out plan.parquet",
    )
    p.add_argument("--model", required=True, metavar="PATH", help="fitted model file (a GP kind, e.g. dbk-rbf)")
    p.add_argument("--budget", required=True, type=int, metavar="N", help="number of visits")
    p.add_argument("--tests-per-visit", type=int, default=5, metavar="K",
                   help="speed tests taken on each visit (default 5)")
    p.add_argument("--h3", type=int, default=8, metavar="RES", help="H3 resolution of the hexagons, 5 to 10 "
                   "(default 8)")
    p.add_argument("--benchmark", metavar="D/U",
                   help="download/upload Mbps pair, e.g. 35/3, 5/1, 7/1, 100/20, 25/3 (default: the service's "
                   "FCC pair); a one-target model uses its own target's number")
    p.add_argument("--quarter", help="quarter, e.g. 2023Q4 (default: the model's latest fitted quarter)")
    p.add_argument("--out", required=True, metavar="PATH", help="the plan: *.parquet (GeoParquet), *.geojson or *.csv")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.set_defaults(handler=_run_plan)


def _run_plan(args: argparse.Namespace) -> int:
    from geodbk.decisions.visits import plan_hexagon_visits
    from geodbk.fileio import check_output
    from geodbk.fit.geomodel import GeoModel
    from geodbk.maps.summaries import write_summary

    check_positive(args, ("budget", "tests_per_visit"))
    check_output(args.out)
    model = GeoModel.load(args.model)
    plan = plan_hexagon_visits(
        model, args.budget, tests_per_visit=args.tests_per_visit, resolution=args.h3, benchmark=args.benchmark,
        quarter=args.quarter, progress=not args.no_progress,
    )
    print(plan.drop(columns="geometry").to_string(index=False, max_rows=20))
    print(f"wrote {write_summary(plan, args.out)}")
    return 0
