"""Where a map fit's time goes: dbk-rbf's fit on a shipped sample by stage, beside the peers and
beside an earlier commit, in one run on one machine.

The fit is the demo's (:class:`geodbk.workflow.DemoConfig`: the CPU preset, the space-time
protocol, the shipped fixed-broadband density layer, the random split) on one target. Stages
are read from one cProfile of the fit: the cumulative seconds of the functions that do each
stage (:data:`STAGES`), so no timing code lives in the package. Profiling adds about 1%.

``--baseline REV`` fits the same dataset with the package as it was at commit ``REV`` (a
temporary ``git worktree``, imported through ``PYTHONPATH`` in a child process, profiled by
this script's own harness), and the table gains its column and the speed-up. ``--peers``
fits the benchmark's peers (:mod:`peers`) on the same dataset and density layer.

Threads: torch's CPU threads slow down about 10x when another busy process shares the cores,
so run it alone, or pin it (``taskset -c 0``, ``OMP_NUM_THREADS=1``). Every column of one run
shares the machine and the threads.

Usage::

    .venv/bin/python benchmarks/bench_fit_time.py --baseline HEAD~3
    .venv/bin/python benchmarks/bench_fit_time.py --region HI --peers lightgbm:map
    OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python benchmarks/bench_fit_time.py --peers gpboost:map,lightgbm:map
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Stage -> (file suffix, function name) whose cumulative time is that stage's.
STAGES: dict[str, tuple[str, str]] = {
    "training": ("geodbk/fit/train.py", "fit_arrays"),
    "conjugate refit": ("geodbk/fit/regressor.py", "refit_posterior"),
    "GP predictions": ("geodbk/fit/regressor.py", "predict"),
    "validation areas": ("geodbk/fit/fitting.py", "_validation_areas"),
    "residual field": ("geodbk/fit/residuals.py", "fit"),
    "measurement tails": ("geodbk/fit/tails.py", "fit_measurement_tails"),
}
#: The residual field's parts after its kernel search, inside its stage (the search is the rest).
FIELD_PARTS: dict[str, tuple[str, str]] = {
    "  forecast rate": ("geodbk/fit/residual_choice.py", "pseudo_forecast_rate"),
    "  leave-one-out": ("geodbk/fit/residuals.py", "leave_one_out"),
    "  volatility": ("geodbk/fit/volatility.py", "fit"),
}
REPO = Path(__file__).resolve().parents[1]


def _cumulative(stats: pstats.Stats, where: tuple[str, str]) -> float:
    """Cumulative seconds of the function ``where`` = (file suffix, name); 0 if never called."""
    suffix, name = where
    total = 0.0
    for (filename, _, function), (_, _, _, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        if function == name and filename.replace(os.sep, "/").endswith(suffix):
            total += cumulative
    return total


def profile_fit(region: str, split: str, seed: int) -> dict[str, float]:
    """Seconds of one dbk-rbf fit of ``region``'s download sample by stage (with ``total``)."""
    import warnings

    from geodbk.dataset.spatial_dataset import load_sample_dataset
    from geodbk.fit.fitting import fit_dataset
    from geodbk.workflow import DemoConfig

    demo = DemoConfig(region=region, progress=False, seed=seed)
    dataset = load_sample_dataset(region, "download").with_split(split)
    density = demo.density_tiles(dataset)
    profiler = cProfile.Profile()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profiler.runcall(fit_dataset, dataset, "dbk-rbf", density_tiles=density, **demo.overrides())
    total = time.perf_counter() - start
    stats = pstats.Stats(profiler)
    seconds = {stage: _cumulative(stats, where) for stage, where in STAGES.items()}
    seconds.update({part: _cumulative(stats, where) for part, where in FIELD_PARTS.items()})
    seconds["  kernel search"] = seconds["residual field"] - sum(seconds[part] for part in FIELD_PARTS)
    seconds["other"] = total - sum(seconds[s] for s in STAGES)
    seconds["total"] = total
    return seconds


def profile_at(rev: str, region: str, split: str, seed: int) -> dict[str, float]:
    """:func:`profile_fit` with the package as it was at commit ``rev`` (a child process)."""
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), rev],
                       check=True, capture_output=True)
        try:
            env = {**os.environ, "PYTHONPATH": str(tree)}
            done = subprocess.run(
                [sys.executable, __file__, "--child", "--region", region, "--split", split, "--seed", str(seed)],
                env=env, check=True, capture_output=True, text=True,
            )
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def peer_seconds(region: str, split: str, seed: int, peers: list[str]) -> dict[str, float]:
    """Fit seconds of each ``peer:variant`` on the same dataset and density layer."""
    sys.path.insert(0, str(Path(__file__).parent))
    from peers import fit_peer, missing_peers

    from geodbk.dataset.spatial_dataset import load_sample_dataset
    from geodbk.workflow import DemoConfig

    demo = DemoConfig(region=region, progress=False, seed=seed)
    dataset = load_sample_dataset(region, "download").with_split(split)
    density = demo.density_tiles(dataset)
    out = {}
    missing = missing_peers([row.split(":", 1)[0] for row in peers])
    for row in peers:
        peer, variant = row.split(":", 1)
        if peer in missing:
            print(f"{row}: left out ({missing[peer]})")
            continue
        start = time.perf_counter()
        fit_peer(dataset, peer, variant, seed=seed, density_tiles=density)
        out[row] = time.perf_counter() - start
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--region", default="PR", choices=["PR", "HI"])
    parser.add_argument("--split", default="random")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline", help="also fit with the package at this commit (git revision)")
    parser.add_argument("--peers", default="", help="comma-separated peer rows, e.g. gpboost:map,lightgbm:map")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        import geodbk

        print(f"geodbk from {Path(geodbk.__file__).parent}", file=sys.stderr)
        print(json.dumps(profile_fit(args.region, args.split, args.seed)))
        return 0

    import torch

    print(f"dbk-rbf fit of {args.region} download, {args.split} split, seed {args.seed}; "
          f"{os.cpu_count()} cores, torch threads {torch.get_num_threads()}")
    columns = {"HEAD": profile_fit(args.region, args.split, args.seed)}
    if args.baseline:
        columns[args.baseline] = profile_at(args.baseline, args.region, args.split, args.seed)
    names = list(columns)
    print(f"\n{'stage':<22}" + "".join(f"{n:>12}" for n in names))
    for stage in [*STAGES, "  kernel search", *FIELD_PARTS, "other", "total"]:
        print(f"{stage:<22}" + "".join(f"{columns[n].get(stage, float('nan')):>12.1f}" for n in names))
    if args.baseline:
        ratio = columns["HEAD"]["total"] / columns[args.baseline]["total"]
        print(f"\nspeed-up: HEAD takes {ratio:.2f}x the time of {args.baseline} "
              f"({columns[args.baseline]['total'] / columns['HEAD']['total']:.2f}x faster)")
    peers = [p for p in args.peers.split(",") if p]
    if peers:
        seconds = peer_seconds(args.region, args.split, args.seed, peers)
        for row, s in seconds.items():
            print(f"{row:<22}{s:>12.1f}   dbk-rbf / {row}: {columns['HEAD']['total'] / s:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
