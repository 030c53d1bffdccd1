"""Map quality by region, split protocol and model: the table every modelling change is judged by.

For each region (the shipped PR and HI download samples) and each split protocol
(``random``, ``spatial-block``, ``forecast``), fit the space-time models and the
``knn`` baseline, plus the paper's protocol (region box, no time, one noise) on the
random split as the replication rows, and print NLL, MAE, CRPS, 95% coverage and PI
width for the urban and rural classes. Then print the acceptance checks of the issue
"Maps that beat the simplest honest baseline" as PASS/FAIL lines.

Choices are made on validation data (``--eval val``); reports use the test split
(``--eval test``, the default). ``--tune`` instead prints the validation NLL of dbk-rbf
over a grid of positional-encoding settings (the defaults in :mod:`geodbk.fit.geomodel` are
checked against it).

Usage::

    .venv/bin/python benchmarks/bench_quality.py                      # PR and HI, test split
    .venv/bin/python benchmarks/bench_quality.py --regions PR --splits random --eval val
    .venv/bin/python benchmarks/bench_quality.py --tune --regions PR,HI
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import pandas as pd

from geodbk.dataset.spatial_dataset import load_sample_dataset
from geodbk.errors import ExtrapolationWarning
from geodbk.fit.geomodel import ENCODING_SCALES, MIN_WAVELENGTH_M, fit_dataset, map_model_config
from geodbk.models.config import TrainConfig
from geodbk.workflow import DemoConfig, evaluate_on_test

SPACE_TIME_MODELS = ("dbk-rbf", "sv-dkl", "knn")
PAPER_MODELS = ("dbk-rbf", "sv-dkl", "sv-rbf")
SPLITS = ("random", "spatial-block", "forecast")
COLUMNS = ["NLL", "MAE", "CRPS", "coverage95", "pi_width"]


def fit_and_score(dataset, kind: str, protocol: str, train_config: TrainConfig, on: str, **fit_kw) -> pd.DataFrame:
    """Urban/rural metrics of one fit on split ``on`` (forecast's test quarter is one quarter
    ahead of training by design, so its extrapolation warning is silenced here)."""
    model = fit_dataset(dataset, kind, protocol=protocol, train_config=train_config, **fit_kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        return evaluate_on_test(model, dataset, on)


def quality_table(
    region: str, splits: list[str], models: list[str], train_config: TrainConfig, on: str, protocols: list[str]
) -> pd.DataFrame:
    rows = []
    base = load_sample_dataset(region, "download")
    runs = [("space-time", split, kind) for split in splits for kind in models if "space-time" in protocols]
    runs += [("paper", "random", kind) for kind in PAPER_MODELS if "random" in splits and "paper" in protocols]
    for protocol, split, kind in runs:
        dataset = base.with_split(split)
        start = time.perf_counter()
        metrics = fit_and_score(dataset, kind, protocol, train_config, on)
        seconds = time.perf_counter() - start
        for group in ("urban", "rural", "overall"):
            row = metrics.loc[group]
            rows.append({"protocol": protocol, "split": split, "model": kind, "group": group,
                         **{c: float(row[c]) for c in COLUMNS}, "n": int(row["n"]), "seconds": seconds})
        overall = metrics.loc["overall"]
        print(f"  {region} {protocol:10s} {split:13s} {kind:8s} NLL {overall.NLL:.4f} MAE {overall.MAE:.4f} "
              f"cover {100 * overall.coverage95:.1f}%  ({seconds:.0f} s)", file=sys.stderr, flush=True)
    return pd.DataFrame(rows)


def wide(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (protocol, split, model); columns metric x group (urban, rural)."""
    shown = table[table["group"].isin(["urban", "rural"])]
    out = shown.pivot_table(index=["protocol", "split", "model"], columns="group", values=COLUMNS, sort=False)
    out = out.reindex(columns=pd.MultiIndex.from_product([COLUMNS, ["urban", "rural"]]))
    for group in ("urban", "rural"):
        out[("coverage95", group)] = 100 * out[("coverage95", group)]
    return out.round(3)


def checks(table: pd.DataFrame) -> list[tuple[bool, str]]:
    """The issue's acceptance checks on one region's long table."""
    def get(protocol: str, split: str, model: str, group: str, column: str) -> float | None:
        hit = table[(table.protocol == protocol) & (table.split == split) & (table.model == model) & (table.group == group)]
        return None if hit.empty else float(hit[column].iloc[0])

    out = []
    dbk, knn = get("space-time", "random", "dbk-rbf", "overall", "NLL"), get("space-time", "random", "knn", "overall", "NLL")
    if dbk is not None and knn is not None:
        out.append((dbk <= knn - 0.08, f"random: dbk-rbf NLL {dbk:.4f} <= knn NLL {knn:.4f} - 0.08"))
        dm, km = (get("space-time", "random", m, "overall", "MAE") for m in ("dbk-rbf", "knn"))
        out.append((dm <= km - 0.01, f"random: dbk-rbf MAE {dm:.4f} <= knn MAE {km:.4f} - 0.01"))
    dbk, knn = (get("space-time", "spatial-block", m, "overall", "NLL") for m in ("dbk-rbf", "knn"))
    if dbk is not None and knn is not None:
        out.append((dbk <= knn, f"spatial-block: dbk-rbf NLL {dbk:.4f} <= knn NLL {knn:.4f}"))
    for split in table.split.unique():
        for group in ("urban", "rural"):
            cover = get("space-time", split, "dbk-rbf", group, "coverage95")
            if cover is not None:
                out.append((0.935 <= cover <= 0.965, f"{split}: dbk-rbf {group} coverage {100 * cover:.1f}% in [93.5, 96.5]"))
    paper = [get("paper", "random", m, "overall", "NLL") for m in PAPER_MODELS]
    if None not in paper:
        out.append((paper[0] < paper[1] < paper[2],
                    "paper protocol: NLL dbk-rbf {:.4f} < sv-dkl {:.4f} < sv-rbf {:.4f}".format(*paper)))
    return out


def tune(regions: list[str], train_config: TrainConfig) -> None:
    """Validation NLL of dbk-rbf (random and spatial-block splits) over encoding settings."""
    grid = [(0, MIN_WAVELENGTH_M), (4, 1000.0), (8, 1000.0), (8, 500.0), (12, 300.0)]
    print("dbk-rbf validation NLL by positional encoding (scales, shortest wavelength in m):")
    for region in regions:
        base = load_sample_dataset(region, "download")
        for split in ("random", "spatial-block"):
            dataset = base.with_split(split)
            for scales, metres in grid:
                config = map_model_config("space-time", encoding_scales=scales)
                nll = fit_and_score(dataset, "dbk-rbf", "space-time", train_config, "val",
                                    model_config=config, min_wavelength_m=metres).loc["overall", "NLL"]
                print(f"  {region} {split:13s} scales {scales:2d}  {metres:6.0f} m  val NLL {nll:.4f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regions", default="PR,HI")
    parser.add_argument("--splits", default=",".join(SPLITS))
    parser.add_argument("--models", default=",".join(SPACE_TIME_MODELS))
    parser.add_argument("--protocols", default="space-time,paper", help="space-time, paper (random split only)")
    parser.add_argument("--eval", choices=("val", "test"), default="test")
    parser.add_argument("--epochs", type=int, help="default: the CPU schedule of geodbk fit / the demo")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--tune", action="store_true", help="print the encoding grid on validation data instead")
    args = parser.parse_args(argv)
    schedule = DemoConfig(device=args.device, progress=False, epochs=args.epochs).train_config()
    regions = [r.strip() for r in args.regions.split(",") if r.strip()]
    print(f"schedule: {schedule.epochs} epochs, lr {schedule.lr:g}, batch {schedule.batch_size}; "
          f"encoding {ENCODING_SCALES} scales down to {MIN_WAVELENGTH_M:g} m; metrics on the {args.eval} split")
    if args.tune:
        tune(regions, schedule)
        return 0
    failed = 0
    for region in regions:
        table = quality_table(
            region, args.splits.split(","), args.models.split(","), schedule, args.eval, args.protocols.split(",")
        )
        print(f"\n## {region} download, {args.eval} split (y = log10 Mbps; coverage in %)\n")
        print(wide(table).to_string())
        print()
        for ok, text in checks(table):
            failed += not ok
            print(f"{'PASS' if ok else 'FAIL'}  {region} {text}")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
