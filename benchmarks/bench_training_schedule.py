"""Which training schedule reaches the map's validation NLL in the fewest steps: dbk-rbf fits of the
shipped samples under several (batch size, learning rate, epochs) schedules, in one run.

Each fit is the demo's (:class:`geodbk.workflow.DemoConfig`, density layer, residual field,
conjugate refit) with the schedule's three settings over the CPU preset. The table gives, per
region, split and schedule: the optimiser steps taken, the epoch of the best training-validation
NLL (the weights the fit keeps) and the first epoch within 0.003 of it, that NLL, the whole map
model's validation NLL (a new measurement at each validation row, as the benchmarks score it),
the training and whole-fit seconds, and each schedule's steps and map NLL against the first
schedule's (the reference). Choices are made on validation rows only.

Usage::

    OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python benchmarks/bench_training_schedule.py
    .venv/bin/python benchmarks/bench_training_schedule.py --regions HI --splits random \
        --schedules 1024:0.01:40,4096:0.02:20
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import pandas as pd

from geodbk.dataset.spatial_dataset import load_sample_dataset
from geodbk.fit import fitting
from geodbk.workflow import DemoConfig, evaluate_on_test

#: batch:lr:epochs; the first is the reference (the CPU preset before this benchmark).
DEFAULT_SCHEDULES = "1024:0.01:40,2048:0.014:27,4096:0.02:40,4096:0.02:20,4096:0.04:20"
#: A schedule "reaches" an NLL when it is within this of it (nats per row).
WITHIN = 0.003


def parse_schedules(text: str) -> list[tuple[int, float, int]]:
    """``"1024:0.01:40,..."`` -> [(batch, lr, epochs), ...]."""
    out = []
    for item in text.split(","):
        batch, lr, epochs = item.split(":")
        out.append((int(batch), float(lr), int(epochs)))
    return out


def run_one(region: str, split: str, batch: int, lr: float, epochs: int, seed: int) -> dict[str, float]:
    """One demo fit under the schedule: its steps, epochs, NLLs and seconds."""
    demo = DemoConfig(region=region, progress=False, seed=seed, epochs=epochs, lr=lr)
    dataset = load_sample_dataset(region, "download").with_split(split)
    density = demo.density_tiles(dataset)
    training = {"seconds": 0.0}
    fit_arrays = fitting.fit_arrays

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fit_arrays(*args, **kwargs)
        finally:
            training["seconds"] += time.perf_counter() - start

    fitting.fit_arrays = timed
    try:
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = fitting.fit_dataset(dataset, "dbk-rbf", density_tiles=density, batch_size=batch,
                                        **demo.overrides())
        seconds = time.perf_counter() - start
    finally:
        fitting.fit_arrays = fit_arrays
    history = pd.DataFrame(model.regressor.history)
    best = float(history["val_nll"].min())
    reached = int(history.loc[history["val_nll"] <= best + WITHIN, "epoch"].min())
    n_train = int(model.info.n_train)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        map_nll = float(evaluate_on_test(model, dataset, "val").loc["overall", "NLL"])
    return {
        "steps": len(history) * math.ceil(n_train / batch),
        "epochs run": len(history),
        "best epoch": int(model.regressor.best_epoch),
        "within epoch": reached,
        "train val NLL": best,
        "map val NLL": map_nll,
        "train s": training["seconds"],
        "fit s": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regions", default="PR,HI")
    parser.add_argument("--splits", default="random,spatial-block")
    parser.add_argument("--schedules", default=DEFAULT_SCHEDULES, help="batch:lr:epochs,... (the first: reference)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    schedules = parse_schedules(args.schedules)
    rows = []
    for region in args.regions.split(","):
        for split in args.splits.split(","):
            for batch, lr, epochs in schedules:
                row = {"region": region, "split": split, "schedule": f"b{batch} lr{lr:g} e{epochs}"}
                row.update(run_one(region, split, batch, lr, epochs, args.seed))
                rows.append(row)
                print(pd.DataFrame([row]).to_string(index=False, header=len(rows) == 1), flush=True)
    table = pd.DataFrame(rows)
    reference = table.groupby(["region", "split"]).transform("first")
    table["steps / ref"] = table["steps"] / reference["steps"]
    table["map NLL - ref"] = table["map val NLL"] - reference["map val NLL"]
    table["fit s / ref"] = table["fit s"] / reference["fit s"]
    print()
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}" if abs(v) < 10 else f"{v:.1f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
