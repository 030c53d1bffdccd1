"""Map quality by region, split protocol and model: the table every modelling change is judged by.

For each region (the shipped PR and HI download samples) and each split protocol
(``random``, ``spatial-block``, ``forecast``), fit the space-time models, the
``knn`` baseline and the two practical peers of :mod:`peers` (GPBoost and LightGBM, each
as ``<peer>:tests`` with log(tests) in the mean and ``<peer>:map`` with only map-time
covariates), plus the paper's protocol (region box, no time, one noise) on the random
split as the replication rows, and print NLL, MAE, CRPS, 95% coverage and PI width overall
and for the urban and rural classes, with each row's fit time in seconds. Then print the
acceptance checks of the issues "Maps that beat the simplest honest baseline" and "Beat the
practical peers" as PASS/FAIL lines.

The peers need the ``bench`` extra (``pip install -e .[bench]``: gpboost, lightgbm); a peer
whose package cannot be imported is left out with a one-line note. ``--models gpboost:map``
picks one variant of a peer.

Choices are made on validation data (``--eval val``); reports use the test split
(``--eval test``, the default). ``--tune`` instead prints the validation NLL of dbk-rbf
over a grid of positional-encoding settings and of coordinate jitters (the defaults in
:mod:`geodbk.dataset.protocols` came from it).

Usage::

    .venv/bin/python benchmarks/bench_quality.py                      # PR and HI, test split
    .venv/bin/python benchmarks/bench_quality.py --regions PR --splits random --eval val
    .venv/bin/python benchmarks/bench_quality.py --regions PR --splits spatial-block \
        --models knn,gpboost,lightgbm --protocols space-time
    .venv/bin/python benchmarks/bench_quality.py --tune --regions PR,HI
    .venv/bin/python benchmarks/bench_quality.py --seeds 3 --models dbk-rbf,sv-dkl --protocols space-time
    .venv/bin/python benchmarks/bench_quality.py --split-seed 1 --splits spatial-block --models dbk-rbf,gpboost:map
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import warnings

import numpy as np
import pandas as pd
from peers import PEERS, VARIANTS, fit_peer, missing_peers  # benchmarks/peers.py, beside this script

from geodbk.dataset.coords import ProjectedTransform
from geodbk.dataset.protocols import ENCODING_SCALES, MIN_WAVELENGTH_M, SPACE_TIME, get_protocol
from geodbk.dataset.spatial_dataset import SpatialDataset, load_sample_dataset
from geodbk.dataset.splits import block_ids
from geodbk.errors import ExtrapolationWarning
from geodbk.fit.fitting import fit_dataset
from geodbk.fit.metrics import nll_per_row
from geodbk.workflow import DemoConfig, evaluate_on_test

SPACE_TIME_MODELS = ("dbk-rbf", "sv-dkl", "knn")
#: Default --models: the space-time models and the peers (each peer gives one row per variant).
DEFAULT_MODELS = (*SPACE_TIME_MODELS, *PEERS)
#: The peer rows without test counts in the mean, which the "beat the peers" checks use.
MAP_PEERS = tuple(f"{peer}:map" for peer in PEERS)
PAPER_MODELS = ("dbk-rbf", "sv-dkl", "sv-rbf")
SPLITS = ("random", "spatial-block", "forecast")
#: Coordinate jitters (m) that ``--tune`` tries (the default, 3 km, came from them).
JITTER_GRID_M = (0.0, 1500.0, 3000.0, 5000.0, 8000.0)
COLUMNS = ["NLL", "MAE", "CRPS", "coverage95", "pi_width"]
GROUPS = ("overall", "urban", "rural")


def expand_models(models: list[str]) -> list[str]:
    """Row names of ``--models``: a peer name becomes one row per variant (``gpboost`` ->
    ``gpboost:tests, gpboost:map``); ``peer:variant`` and model kinds stay as they are."""
    out = []
    for name in models:
        out += [f"{name}:{variant}" for variant in VARIANTS] if name in PEERS else [name]
    return out


def fit_and_score(
    dataset: SpatialDataset, kind: str, protocol: str, demo: DemoConfig, on: str, measurement_tails: bool = True,
    density_tiles: pd.DataFrame | None = None, **fit_kw,
) -> tuple[pd.DataFrame, float, np.ndarray]:
    """Metrics (overall, urban, rural) of one fit on split ``on``, the fit's seconds and the
    per-row NLL (n,) of the split's rows in frame order.

    ``kind`` is a model kind of the zoo or a peer row ``"<peer>:<variant>"`` (space-time
    protocol only). ``measurement_tails=False`` keeps every row's new-measurement distribution
    Gaussian (:mod:`geodbk.fit.tails`; the paper protocol is Gaussian anyway). ``density_tiles``
    (another layer's tiles, :meth:`DemoConfig.density_tiles`) go to every space-time fit, peers
    included. Forecast's test quarter is one quarter ahead of training by design, so its
    extrapolation warning is silenced here.
    """
    start = time.perf_counter()
    if ":" in kind:
        peer, variant = kind.split(":", 1)
        if protocol != "space-time":
            raise ValueError(f"the peer {kind} has no {protocol!r} protocol")
        model = fit_peer(dataset, peer, variant, seed=demo.seed, measurement_tails=measurement_tails,
                         density_tiles=density_tiles)
    else:  # the demo's settings over the protocol's, as geodbk fit and the demo fit
        model = fit_dataset(dataset, kind, protocol=protocol, measurement_tails=measurement_tails,
                            density_tiles=density_tiles if get_protocol(protocol).space_time else None,
                            **demo.overrides(), **fit_kw)
    seconds = time.perf_counter() - start
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        # a peer has the predict_tiles of a GeoModel, all that evaluate_on_test calls
        rows = dataset.subset(on)
        scored = model.predict_tiles(rows).measurement()
        per_row = nll_per_row(rows["y"].to_numpy(np.float64), scored)
        return evaluate_on_test(model, dataset, on), seconds, per_row


def resampling_units(dataset: SpatialDataset, on: str) -> np.ndarray:
    """(n,) unit of each row of split ``on`` for the bootstrap: its spatial block under the
    spatial-block split (the unit the split holds out), else its tile (a tile's quarters are
    correlated)."""
    rows = dataset.subset(on)
    if dataset.split_protocol == "spatial-block":
        lonlat = rows[["lon", "lat"]].to_numpy(np.float64)
        projection = ProjectedTransform.from_lonlat(dataset.frame[["lon", "lat"]].to_numpy(np.float64))
        return block_ids(projection.to_metres(lonlat), dataset.block_m)
    return np.unique(rows["quadkey"].to_numpy(), return_inverse=True)[1].reshape(-1)


def bootstrap_difference(difference: np.ndarray, units: np.ndarray, draws: int = 2000, seed: int = 0) -> float:
    """The bootstrap sd of the mean of ``difference`` (n,) when whole ``units`` (n,) are resampled."""
    n_units = int(units.max()) + 1
    sums, counts = np.bincount(units, difference, n_units), np.bincount(units, minlength=n_units)
    picks = np.random.default_rng(seed).integers(0, n_units, (draws, n_units))
    return float(np.std(sums[picks].sum(1) / counts[picks].sum(1)))


def quality_table(
    region: str, splits: list[str], models: list[str], demo: DemoConfig, on: str, protocols: list[str],
    seeds: int = 1, split_seed: int | None = None, measurement_tails: bool = True,
) -> tuple[pd.DataFrame, list[str]]:
    """The long metrics table of one region, and dbk-rbf's NLL minus each map peer's per split with
    its bootstrap sd: how much of a difference the draw of test blocks (or tiles) can make.

    With ``seeds`` > 1, every trained kind (not knn, not the peers, which are fitted once with the
    demo's seed) is fitted with training seeds ``demo.seed, demo.seed + 1, ...`` on the same
    split, and its row holds the metrics averaged over the fits (fit seconds: their mean; the
    per-row NLL behind the comparisons: its mean over the fits). One fit's spatial-block NLL
    moves by 0.01-0.03 with the seed, and even with the number of CPU threads. ``split_seed``
    draws another split (default the dataset's, 0): other held-out tiles or blocks (the
    forecast's test quarter stays the last; only its validation rows change)."""
    rows, nll = [], {}
    base = load_sample_dataset(region, "download")
    density = demo.density_tiles(base)
    space_time = expand_models(models) if "space-time" in protocols else []
    runs = [("space-time", split, kind) for split in splits for kind in space_time]
    runs += [("paper", "random", kind) for kind in PAPER_MODELS if "random" in splits and "paper" in protocols]
    for protocol, split, kind in runs:
        dataset = base.with_split(split, seed=split_seed)
        trained = ":" not in kind and kind != "knn"
        fits = [fit_and_score(dataset, kind, protocol, dataclasses.replace(demo, seed=demo.seed + k), on,
                              measurement_tails, density)
                for k in range(seeds if trained else 1)]
        metrics = sum(f[0][COLUMNS + ["n"]] for f in fits) / len(fits)
        seconds = float(np.mean([f[1] for f in fits]))
        nll[(protocol, split, kind)] = np.mean([f[2] for f in fits], axis=0)
        for group in GROUPS:
            row = metrics.loc[group]
            rows.append({"protocol": protocol, "split": split, "model": kind, "group": group,
                         **{c: float(row[c]) for c in COLUMNS}, "n": int(row["n"]), "seconds": seconds})
        overall = metrics.loc["overall"]
        each = "" if len(fits) == 1 else "  seeds: " + " ".join(f"{f[0].loc['overall', 'NLL']:.4f}" for f in fits)
        print(f"  {region} {protocol:10s} {split:13s} {kind:14s} NLL {overall.NLL:.4f} MAE {overall.MAE:.4f} "
              f"cover {100 * overall.coverage95:.1f}%  ({seconds:.0f} s){each}", file=sys.stderr, flush=True)
    comparisons = []
    for split in splits:
        ours = nll.get(("space-time", split, "dbk-rbf"))
        peers = [peer for peer in MAP_PEERS if ("space-time", split, peer) in nll]
        if ours is None or not peers:
            continue
        units = resampling_units(base.with_split(split, seed=split_seed), on)
        what = "blocks" if split == "spatial-block" else "tiles"
        for peer in peers:
            difference = ours - nll[("space-time", split, peer)]
            spread = bootstrap_difference(difference, units)
            comparisons.append(f"{split}: dbk-rbf NLL minus {peer} {difference.mean():+.4f} +/- {spread:.4f} "
                               f"(bootstrap over {units.max() + 1} {what})")
    return pd.DataFrame(rows), comparisons


def wide(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (protocol, split, model); columns metric x group (overall, urban, rural),
    then the fit's seconds."""
    index = ["protocol", "split", "model"]
    out = table.pivot_table(index=index, columns="group", values=COLUMNS, sort=False)
    out = out.reindex(columns=pd.MultiIndex.from_product([COLUMNS, list(GROUPS)]))
    for group in GROUPS:
        out[("coverage95", group)] = 100 * out[("coverage95", group)]
    out[("seconds", "")] = table.groupby(index, sort=False)["seconds"].first().reindex(out.index)
    return out.round(3)


def checks(table: pd.DataFrame) -> list[tuple[bool, str]]:
    """The issue's acceptance checks on one region's long table."""
    def get(protocol: str, split: str, model: str, group: str, column: str) -> float | None:
        hit = table[
            (table.protocol == protocol) & (table.split == split) & (table.model == model) & (table.group == group)
        ]
        return None if hit.empty else float(hit[column].iloc[0])

    out = []
    dbk, knn = (get("space-time", "random", m, "overall", "NLL") for m in ("dbk-rbf", "knn"))
    if dbk is not None and knn is not None:
        out.append((dbk <= knn - 0.08, f"random: dbk-rbf NLL {dbk:.4f} <= knn NLL {knn:.4f} - 0.08"))
        dm, km = (get("space-time", "random", m, "overall", "MAE") for m in ("dbk-rbf", "knn"))
        out.append((dm <= km - 0.01, f"random: dbk-rbf MAE {dm:.4f} <= knn MAE {km:.4f} - 0.01"))
    dbk, knn = (get("space-time", "spatial-block", m, "overall", "NLL") for m in ("dbk-rbf", "knn"))
    if dbk is not None and knn is not None:
        out.append((dbk <= knn, f"spatial-block: dbk-rbf NLL {dbk:.4f} <= knn NLL {knn:.4f}"))
    for split in ("random", "spatial-block"):
        dbk = get("space-time", split, "dbk-rbf", "overall", "NLL")
        peer_nll = {m: get("space-time", split, m, "overall", "NLL") for m in MAP_PEERS}
        known = {m: v for m, v in peer_nll.items() if v is not None}
        if dbk is not None and known:
            best = min(known, key=lambda m: known[m])
            out.append((dbk <= known[best] - 0.02,
                        f"{split}: dbk-rbf NLL {dbk:.4f} <= best map peer {best} NLL {known[best]:.4f} - 0.02"))
    dbk = get("space-time", "spatial-block", "dbk-rbf", "overall", "MAE")
    for peer in MAP_PEERS:
        mae = get("space-time", "spatial-block", peer, "overall", "MAE")
        if dbk is not None and mae is not None:
            out.append((dbk <= mae, f"spatial-block: dbk-rbf MAE {dbk:.4f} <= {peer} MAE {mae:.4f}"))
    for split in table.split.unique():
        for group in ("urban", "rural"):
            cover = get("space-time", split, "dbk-rbf", group, "coverage95")
            if cover is not None:
                text = f"{split}: dbk-rbf {group} coverage {100 * cover:.1f}% in [93.5, 96.5]"
                out.append((0.935 <= cover <= 0.965, text))
    paper = [get("paper", "random", m, "overall", "NLL") for m in PAPER_MODELS]
    if None not in paper:
        out.append((paper[0] < paper[1] < paper[2],
                    "paper protocol: NLL dbk-rbf {:.4f} < sv-dkl {:.4f} < sv-rbf {:.4f}".format(*paper)))
    return out


def tune(regions: list[str], demo: DemoConfig) -> None:
    """Validation NLL of dbk-rbf (random and spatial-block splits) over the positional encoding
    and, at the default encoding, over the coordinate jitter."""
    grid = [(0, MIN_WAVELENGTH_M), (4, 1000.0), (8, 1000.0), (8, 500.0), (12, 300.0)]
    print("dbk-rbf validation NLL by positional encoding (scales, shortest wavelength in m) and by "
          "coordinate jitter (m):")
    for region in regions:
        base = load_sample_dataset(region, "download")
        density = demo.density_tiles(base)
        for split in ("random", "spatial-block"):
            dataset = base.with_split(split)
            for scales, metres in grid:
                metrics, _, _ = fit_and_score(dataset, "dbk-rbf", "space-time", demo, "val", density_tiles=density,
                                              encoding_scales=scales, min_wavelength_m=metres)
                nll = metrics.loc["overall", "NLL"]
                print(f"  {region} {split:13s} scales {scales:2d}  {metres:6.0f} m  val NLL {nll:.4f}", flush=True)
            for jitter in JITTER_GRID_M:
                metrics, _, _ = fit_and_score(dataset, "dbk-rbf", "space-time", demo, "val", density_tiles=density,
                                              coordinate_jitter_m=jitter)
                nll = metrics.loc["overall", "NLL"]
                print(f"  {region} {split:13s} jitter {jitter:6.0f} m  val NLL {nll:.4f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regions", default="PR,HI")
    parser.add_argument("--splits", default=",".join(SPLITS))
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help="model kinds, peers (gpboost, lightgbm: both variants) or peer:variant rows")
    parser.add_argument("--protocols", default="space-time,paper", help="space-time, paper (random split only)")
    parser.add_argument("--eval", choices=("val", "test"), default="test")
    parser.add_argument("--epochs", type=int, help="default: the CPU schedule of geodbk fit / the demo")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seeds", type=int, default=1,
                        help="training seeds per trained model kind, metrics averaged over them (peers: one fit)")
    parser.add_argument("--split-seed", type=int,
                        help="seed of the splits (default the dataset's, 0): other held-out tiles or blocks")
    parser.add_argument("--gaussian", action="store_true",
                        help="score every row's new measurements with a Gaussian (no validation-chosen Student-t)")
    parser.add_argument("--no-density", action="store_true",
                        help="coordinates and time only: no fixed-broadband density layer for any model")
    parser.add_argument("--tune", action="store_true",
                        help="print the encoding and jitter grids on validation data instead")
    args = parser.parse_args(argv)
    demo = DemoConfig(device=args.device, progress=False, epochs=args.epochs, density=not args.no_density)
    schedule = demo.train_config()
    regions = [r.strip() for r in args.regions.split(",") if r.strip()]
    print(f"schedule: {schedule.epochs} epochs, lr {schedule.lr:g}, batch {schedule.batch_size} (the cpu preset "
          "doubles the batch, and raises the lr by 1.41, while an epoch keeps 25 steps: PR 4096); "
          f"encoding {ENCODING_SCALES} scales down to {MIN_WAVELENGTH_M:g} m; coordinate jitter "
          f"{SPACE_TIME.coordinate_jitter_m:g} m; density layer: "
          f"{'shipped fixed-broadband tiles' if demo.density else 'none'}; metrics on the {args.eval} split")
    if args.tune:
        tune(regions, demo)
        return 0
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    missing = missing_peers(sorted({m.split(":", 1)[0] for m in models}))
    if missing:
        print("peers left out (pip install -e .[bench]): "
              + "; ".join(f"{name} ({why})" for name, why in missing.items()))
        models = [m for m in models if m.split(":", 1)[0] not in missing]
    failed = 0
    for region in regions:
        table, comparisons = quality_table(
            region, args.splits.split(","), models, demo, args.eval, args.protocols.split(","), args.seeds,
            args.split_seed, not args.gaussian,
        )
        print(f"\n## {region} download, {args.eval} split (y = log10 Mbps; coverage in %; fit seconds)\n")
        print(wide(table).to_string())
        print()
        for ok, text in checks(table):
            failed += not ok
            print(f"{'PASS' if ok else 'FAIL'}  {region} {text}")
        for text in comparisons:
            print(f"      {region} {text}")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
