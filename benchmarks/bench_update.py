"""Seconds to add new tests to a fitted Puerto Rico model without a refit, and to plan visits on
its real posterior.

The model: dbk-rbf of download and upload on the shipped PR sample (every quarter, random split,
seed 0, the demo's settings and density layer), fitted here unless ``--model`` gives a saved
one. The new rows are the dataset's test rows, which the fit never saw: N of them (default 100,
1,000 and 10,000, the latest quarter's first) go to :meth:`GeoModel.condition
<geodbk.fit.geomodel.GeoModel.condition>`, timed (the best of ``--repeats``), and the conditioned
model's mean absolute error at those rows is printed beside the unconditioned one (conditioning
on a row should pull the prediction there towards it). Then :func:`geodbk.decisions.visits.plan_hexagon_visits`
plans ``--budget`` visits (default 50) among every resolution-8 H3 hexagon of the model's
region, timed once. Issue 34's targets: 1,000 rows timed; the plan in 60 s or less on 2 cores.

    OMP_NUM_THREADS=1 python benchmarks/bench_update.py
    python benchmarks/bench_update.py --model runs/pr2/models/dbk-rbf.pt --dataset runs/pr2/dataset.parquet

``--dataset`` must be the dataset ``--model`` was fitted on (its test rows are the new rows).

Measured on 2 cores (2026-11-27, commit 925e4e4): 100 / 1,000 / 10,000 new rows in 0.10 / 0.11 /
0.18 s, the download MAE at them 0.38 -> 0.30 (1,000 rows); the 50-visit plan among 17,675
hexagons in 60.9 s (118 s at commit 596b71a; docs/scale.md).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

from geodbk.dataset.spatial_dataset import SpatialDataset, load_sample_dataset
from geodbk.dataset.targets import target_column
from geodbk.decisions.visits import plan_hexagon_visits
from geodbk.errors import ExtrapolationWarning
from geodbk.fit.fitting import fit_dataset
from geodbk.fit.geomodel import GeoModel
from geodbk.workflow import DemoConfig


def fitted(args: argparse.Namespace) -> tuple[GeoModel, SpatialDataset]:
    """The saved model and dataset of ``--model`` and ``--dataset``, or a fit of the PR sample."""
    if args.model:
        return GeoModel.load(args.model), SpatialDataset.load(args.dataset)
    dataset = load_sample_dataset("PR", "download,upload")
    demo = DemoConfig(progress=False, seed=0)
    start = time.perf_counter()
    model = fit_dataset(dataset, "dbk-rbf", density_tiles=demo.density_tiles(dataset), **demo.overrides())
    print(f"fitted dbk-rbf of download and upload on {int((dataset.frame['split'] == 'train').sum()):,} PR rows "
          f"in {time.perf_counter() - start:.0f} s")
    return model, dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a saved two-target GeoModel (default: fit one on the PR sample)")
    parser.add_argument("--dataset", help="the dataset --model was fitted on")
    parser.add_argument("--rows", default="100,1000,10000", help="new-row counts to time")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=int, default=50, help="visits of the plan (0: no plan)")
    args = parser.parse_args()
    if bool(args.model) != bool(args.dataset):
        parser.error("--model and --dataset go together")
    warnings.simplefilter("ignore", ExtrapolationWarning)
    model, dataset = fitted(args)
    test = dataset.subset("test").sort_values(["year", "quarter"], ascending=False, kind="stable")
    columns = [target_column(model.info.target, t) for t in model.targets]
    print(f"| new rows | condition, s (best of {args.repeats}) | rows in the field after | "
          + " | ".join(f"MAE at the rows, {t}: before -> after" for t in model.targets) + " |")
    print("|---|---|---|" + "---|" * len(model.targets))
    for n in (int(v) for v in args.rows.split(",") if v):
        rows = test.iloc[:n]
        best, conditioned = np.inf, model
        for _ in range(args.repeats):
            start = time.perf_counter()
            conditioned = model.condition(rows)
            best = min(best, time.perf_counter() - start)
        errors = []
        for target, column in zip(model.targets, columns, strict=True):
            y = rows[column].to_numpy(np.float64)
            before = np.mean(np.abs(y - model.for_target(target).predict_tiles(rows).mean))
            after = np.mean(np.abs(y - conditioned.for_target(target).predict_tiles(rows).mean))
            errors.append(f"{before:.3f} -> {after:.3f}")
        assert conditioned.residuals is not None
        print(f"| {len(rows):,} | {best:.2f} | {len(conditioned.residuals.residual):,} | " + " | ".join(errors) + " |")
    if args.budget:
        start = time.perf_counter()
        plan = plan_hexagon_visits(model, args.budget, resolution=8, progress=False)
        seconds = time.perf_counter() - start
        print(f"\nplan of {len(plan)} visits among the model region's resolution-8 hexagons: {seconds:.1f} s; "
              f"expected wrong decisions {plan['expected_wrong_before'].iloc[0]:.1f} -> "
              f"{plan['expected_wrong_after'].iloc[-1]:.1f}")


if __name__ == "__main__":
    main()
