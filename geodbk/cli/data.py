"""``geodbk ingest`` (Ookla tiles -> dataset file) and ``geodbk fit`` (dataset -> models and metrics in a
run folder; ``--nproc N`` trains data-parallel in N torchrun workers, see :mod:`geodbk.fit.distributed`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from geodbk.cli.options import (
    add_split_options,
    block_metres,
    check_device,
    check_positive,
    check_split_options,
    finite_float,
    input_file,
)

#: Largest ``--rank`` of a fit with a kind trained by gradient (every kind but the closed-form knn)
#: without ``--allow-large-model``: twice the paper's 1024. A fit's memory grows as rank^2 and its
#: time faster than rank (PR's 5,132 training rows, dbk-rbf, one epoch, one core: 0.99 GB and 57 s at
#: 512, 1.16 GB and 181 s at 1024, so about 1.8 GB and 10 minutes at 2048; rank 4000 on 5,508 rows
#: passed 2.9 GB and 120 s).
MAX_FIT_RANK = 2048
#: Widest ``--hidden`` of a fit with a kind trained by gradient without ``--allow-large-model``: four
#: times the paper's 256 (the backbone's weights, their gradients and optimiser state grow as hidden^2).
MAX_FIT_HIDDEN = 1024


def _add_ingest(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ingest", help="build a dataset from Ookla tiles and print its summary")
    src = p.add_argument_group("tiles (default: the shipped mobile sample of --region, PR or HI)")
    src.add_argument("--tiles", nargs="+", metavar="PATH_OR_URL",
                     help="Ookla tile file(s): Parquet, GeoJSON, shapefile or zip; path or http(s) URL, or "
                          "'mobile:2023Q4' for Ookla's global file of a service and quarter (give several for "
                          "several quarters). "
                          "Parquet is read a batch at a time and only the region's rows are kept, "
                          "so Ookla's global files need no more memory than the region's tiles")
    src.add_argument("--service", choices=("mobile", "fixed"), default=None,
                     help="keep this service; with --year/--quarter, the Ookla file to download")
    src.add_argument("--year", type=int, help="download Ookla's global file of this year ...")
    src.add_argument("--quarter", type=int, choices=(1, 2, 3, 4), help="... and quarter")
    p.add_argument("--region", default="PR",
                   help="state (name, USPS code or FIPS code), counties ('Kauai, HI', FIPS '15007'; "
                   "several joined by '+': 'Vieques, PR+Culebra, PR'), or a polygon file (default PR)")
    p.add_argument("--target", default="download", metavar="TARGET[,TARGET]",
                   help="download (default), upload or latency, or download,upload: both speeds of each tile, "
                   "so that `geodbk fit` writes one model of the pair and P(meets a download/upload benchmark)")
    p.add_argument("--quarters", help="comma-separated quarters to keep, e.g. 2023Q1,2023Q4 (default all)")
    p.add_argument("--urban-areas", metavar="PATH_OR_URL",
                   help="Census 2020 Urban Area polygons (default: county urban share)")
    p.add_argument("--urban-threshold", type=finite_float, default=0.5,
                   help="county route: urban when the county urban population share >= this")
    p.add_argument("--buffer", type=finite_float, default=None, metavar="DEG",
                   help="grow the region polygon by this many degrees before clipping (default 0.01)")
    add_split_options(p)
    p.add_argument("--cache-dir", help="download cache folder")
    p.add_argument("--max-download-mb", type=float, metavar="MB",
                   help="refuse a URL download larger than this (default 8590 MB, 8 GiB)")
    p.add_argument("--download-deadline", type=float, metavar="SECONDS",
                   help="stop a URL download that takes longer than this in all (default 3600)")
    p.add_argument("--out", metavar="PATH", help="write the dataset here (GeoParquet)")
    p.set_defaults(handler=_run_ingest)


def _run_ingest(args: argparse.Namespace) -> int:
    from pathlib import Path

    from geodbk.dataset.spatial_dataset import sample_tiles_path
    from geodbk.errors import InputDataError, RegionError
    from geodbk.fileio import check_output
    from geodbk.ingest.ookla import ookla_url
    from geodbk.ingest.regions import load_region
    from geodbk.ingest.sources import download_limits

    check_split_options(args)
    for flag in ("max_download_mb", "download_deadline"):
        value = getattr(args, flag)
        if value is not None and not value > 0:
            raise InputDataError(f"--{flag.replace('_', '-')} must be positive, got {value}")
    if args.tiles and (args.year or args.quarter):
        raise InputDataError("give either --tiles or --year/--quarter, not both")
    region = load_region(args.region)  # once, and before any download: an unknown region is refused as such
    if args.tiles:
        tiles = args.tiles
    elif args.year or args.quarter:
        if not (args.year and args.quarter and args.service):
            raise InputDataError("downloading Ookla's file needs --service, --year and --quarter")
        tiles = [ookla_url(args.service, args.year, args.quarter)]
    else:
        try:
            tiles = [sample_tiles_path(region)]
        except RegionError as err:  # a region outside the samples: say how to give its tiles
            raise RegionError(f"{err}; give its tiles: --tiles mobile:2023Q4 (Ookla's global file), FILE_OR_URL, "
                             "or --service, --year, --quarter") from err
    if args.out:  # before any download or reading: the output may not replace a folder or an input
        check_output(args.out, name="--out", inputs=[path for path in tiles if Path(path).exists()])
    max_bytes = None if args.max_download_mb is None else int(args.max_download_mb * 1e6)
    with download_limits(max_bytes, args.download_deadline):
        dataset = _build(args, region, tiles)
    _check_ingested_split(dataset, asked=args.split is not None)
    print(dataset.summary())
    if args.out:
        print(f"wrote {dataset.save(args.out)}")
    return 0


def _check_ingested_split(dataset: Any, *, asked: bool) -> None:
    """Refuse a --split that leaves too little to validate or test on; without --split the dataset
    is still written, with a warning that ``geodbk fit`` will refuse its split."""
    import warnings

    from geodbk.errors import InputDataError

    try:
        dataset.check_split()
    except InputDataError as err:
        if asked:
            raise
        warnings.warn(f"geodbk fit will refuse this dataset's split: {err}", UserWarning, stacklevel=2)


def _build(args: argparse.Namespace, region: Any, tiles: list[str]) -> Any:
    """The dataset of ``geodbk ingest``'s options over ``region`` (a resolved
    :class:`~geodbk.ingest.regions.Region`) from ``tiles`` (paths or URLs)."""
    from geodbk.dataset.spatial_dataset import build_dataset
    from geodbk.ingest.regions import DEFAULT_BUFFER_DEG

    return build_dataset(
        tiles if len(tiles) > 1 else tiles[0],
        region,
        target=args.target,
        quarters=args.quarters,
        seed=args.seed,
        split=args.split or "random",
        block_m=block_metres(args),
        urban_areas=args.urban_areas,
        urban_threshold=args.urban_threshold,
        service=args.service,
        buffer_deg=DEFAULT_BUFFER_DEG if args.buffer is None else args.buffer,
        cache_dir=args.cache_dir,
    )


def _add_fit(sub: argparse._SubParsersAction) -> None:
    from geodbk.dataset.protocols import PROTOCOLS, SPACE_TIME

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
            "on the full Puerto Rico sample in minutes on 2 cores): h=64, r=128, 20 epochs of batch 1024 "
            "at lr 1e-2, the batch doubled (to at most 8192) and the lr times 1.41 while an epoch keeps 25 "
            "steps, more epochs while the fit is under 500 steps (a small region), fewer past 1.5 million "
            "rows; --paper-size: the paper's h=256, r=1024, 400 epochs, "
            "lr 1e-3 (explicit flags win)."
        ),
        epilog="example: geodbk fit --dataset outputs/demo/dataset.parquet --models dbk-rbf,knn "
        "--split spatial-block --out runs/pr-blocks",
    )
    p.add_argument("--dataset", required=True, metavar="PATH", type=input_file,
                   help="dataset file (GeoParquet from geodbk)")
    p.add_argument("--out", required=True, metavar="RUN", help="run folder to write")
    p.add_argument("--models", default="dbk-rbf,sv-rbf,sv-dkl,knn",
                   help="comma-separated model kinds (default dbk-rbf,sv-rbf,sv-dkl,knn); known: dbk-rbf, "
                   "dbk-silu, exact-dbk, sv-rbf, sv-dkl, pp-dkl, vbll, dnn, knn and registered extras")
    p.add_argument("--protocol", choices=list(PROTOCOLS), default=SPACE_TIME.name,
                   help="model inputs (default space-time; paper: region box, no time, one noise)")
    p.add_argument("--no-test-noise", action="store_true",
                   help="one noise variance instead of sigma0^2 + sigma1^2/tests (space-time protocol)")
    p.add_argument("--encoding-scales", type=int,
                   help="wavelengths of the positional encoding (default 8; 0 = none; paper protocol: 0)")
    p.add_argument("--min-wavelength", type=finite_float, default=None, metavar="METRES",
                   help="shortest positional-encoding wavelength, metres (default 1000, about 2 tiles)")
    p.add_argument("--coordinate-jitter", type=finite_float, default=None, metavar="METRES",
                   help="sd of the noise on the training places, metres (default 3000 for space-time; 0 = none)")
    p.add_argument("--density-tiles", nargs="+", default=None, metavar="PATH",
                   help="another Ookla layer over the region (files or URLs, e.g. its fixed-broadband tiles; "
                   "'fixed:2023Q4' downloads Ookla's global fixed file of that quarter once): its test density and "
                   "mean download speed around each place (windows in geodbk.dataset.density) become model inputs "
                   "known at every map cell (space-time protocol; default none)")
    p.add_argument("--epochs", type=int, help="maximum training epochs (default 20, more for a region of few rows, "
                   "fewer past 1.5 million; 400 with --paper-size)")
    p.add_argument("--hidden", type=int, help="backbone width h (default 64; 256 with --paper-size)")
    p.add_argument("--rank", type=int, help="basis rank / inducing points r (default 128; 1024 with --paper-size)")
    p.add_argument("--paper-size", action="store_true", help="the paper's h=256, r=1024, 400 epochs, lr 1e-3")
    p.add_argument("--lr", type=finite_float, help="AdamW learning rate (default 1e-2; 1e-3 with --paper-size)")
    p.add_argument("--batch-size", type=int, help="mini-batch size (default 1024)")
    p.add_argument("--patience", type=int, default=50,
                   help="stop after this many epochs without a better validation NLL (default 50)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="default float32")
    p.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda or cuda:N")
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="train data-parallel in N processes on this machine, started by torchrun: one GPU "
                   "each (NCCL) on CUDA, else gloo on the CPU cores shared among them; same results as 1 "
                   "process up to rounding (default 1)")
    add_split_options(p, keep=True)
    p.add_argument("--allow-large-model", action="store_true",
                   help=f"fit a --rank above {MAX_FIT_RANK} or a --hidden above {MAX_FIT_HIDDEN} (kinds trained by "
                   "gradient), more than 64 encoding scales or over 2 GiB of weights (refused otherwise, before "
                   "training)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.set_defaults(handler=_run_fit)


def _run_fit(args: argparse.Namespace) -> int:
    from geodbk.fit.distributed import is_worker, launch

    _check_fit(args)
    if is_worker():
        return _fit_worker(args)
    if args.nproc > 1:
        status = launch(args.nproc, ["geodbk", *_fit_argv(args)])
        if status:
            print(f"geodbk fit: error: a worker of {args.nproc} failed with exit status {status} (its message "
                  "is above); the others were stopped", file=sys.stderr)
        return status
    return _fit(args, args.device, main=True)


def _fit_argv(args: argparse.Namespace) -> list[str]:
    """``geodbk fit`` arguments that parse back to ``args`` (without --nproc), for the workers.

    Every fit option's flag is its dest with dashes; store-true options are given when true."""
    argv = [args.command]
    for dest, value in vars(args).items():
        if dest in ("command", "handler", "nproc") or value is None or value is False:
            continue
        flag = "--" + dest.replace("_", "-")
        argv.append(flag if value is True else f"{flag}={value}")
    return argv


def _fit_worker(args: argparse.Namespace) -> int:
    """One torchrun worker: join the process group, fit (rank 0 prints and writes), leave it."""
    import torch.distributed as dist

    from geodbk.fit.distributed import init_worker

    device = init_worker(args.device)
    try:
        return _fit(args, device, main=dist.get_rank() == 0)
    finally:
        dist.destroy_process_group()


def _check_fit(args: argparse.Namespace) -> None:
    """The checks of ``geodbk fit``'s options that need no data (before any worker starts)."""
    from geodbk.errors import InputDataError, ResourceLimitError
    from geodbk.models import available_models, get_model_spec

    kinds = _kinds(args)
    unknown = [k for k in kinds if k not in available_models()]
    if not kinds or unknown:
        raise InputDataError(f"unknown or no model kinds {unknown}; known: {', '.join(available_models())}")
    check_positive(args, ("epochs", "hidden", "rank", "batch_size", "patience", "nproc"))
    trained = [k for k in kinds if get_model_spec(k).fit is None]  # knn, fitted in closed form, has no network
    for flag, value, limit in (("rank", args.rank, MAX_FIT_RANK), ("hidden", args.hidden, MAX_FIT_HIDDEN)):
        if trained and not args.allow_large_model and value is not None and value > limit:
            raise ResourceLimitError(f"--{flag} {value} is above the limit of {limit} for fitting "
                                     f"{', '.join(trained)} (memory grows as {flag}^2); lower --{flag}, or pass "
                                     "--allow-large-model to fit it anyway")
    check_split_options(args)
    check_device(args.device, allow_auto=True)
    if args.lr is not None and not args.lr > 0:
        raise InputDataError(f"--lr must be positive, got {args.lr}")
    if args.encoding_scales is not None and args.encoding_scales < 0:
        raise InputDataError(f"--encoding-scales must be >= 0, got {args.encoding_scales}")
    if args.min_wavelength is not None and not args.min_wavelength > 0:
        raise InputDataError(f"--min-wavelength must be positive metres, got {args.min_wavelength}")
    if args.coordinate_jitter is not None and args.coordinate_jitter < 0:
        raise InputDataError(f"--coordinate-jitter must be >= 0 metres, got {args.coordinate_jitter}")


def _kinds(args: argparse.Namespace) -> list[str]:
    """The model kinds of --models."""
    return [k.strip() for k in args.models.split(",") if k.strip()]


def _fit(args: argparse.Namespace, device: str, *, main: bool) -> int:
    """Fit and evaluate every kind, then write the run folder with the kinds that finished: a kind
    that fails is named with its reason in one error line after the others are saved
    (:func:`_failed_kinds`), except in a torchrun job, which stops at the first failure. Only
    ``main`` checks the split and the run folder, prints and writes (a refusal there stops the
    other workers)."""
    import time
    from pathlib import Path

    from geodbk.dataset.protocols import MIN_WAVELENGTH_M, get_protocol
    from geodbk.dataset.spatial_dataset import SAMPLE_TILES, SpatialDataset
    from geodbk.fit.distributed import is_worker
    from geodbk.fit.fitting import fit_dataset
    from geodbk.fit.metrics import format_metrics_table
    from geodbk.fit.protocol import configs
    from geodbk.models.config import check_model_size
    from geodbk.workflow import RunFolder, evaluate_targets, metrics_heading, metrics_notes, pair_correlations

    def echo(text: str) -> None:
        if main:
            print(text)

    kinds = _kinds(args)
    preset = "paper" if args.paper_size else "cpu"
    overrides: dict[str, Any] = {
        "hidden": args.hidden, "rank": args.rank, "epochs": args.epochs, "batch_size": args.batch_size,
        "lr": args.lr, "patience": args.patience, "seed": args.seed, "device": device,
        "progress": not args.no_progress, "dtype": args.dtype, "encoding_scales": args.encoding_scales,
        "test_noise": False if args.no_test_noise else None,
    }
    model_config = configs(get_protocol(args.protocol), preset, **overrides)[0]
    dataset = SpatialDataset.load(args.dataset, geometry=False)  # polygons: 1.6 KB a row, not needed to fit
    if args.split is not None:
        dataset = dataset.with_split(args.split, seed=args.seed, block_m=block_metres(args))
    if main:  # a split too small to validate or test on is refused before anything is fitted
        dataset.check_split()
    n_train = int((dataset.frame["split"] == "train").sum())
    check_model_size(model_config, 3, n_train, allow_large=args.allow_large_model)  # before any tensor
    run = RunFolder(Path(args.out))
    if main:  # the run folder is checked before training, and again when the fits are saved
        run.check_fits(dataset, kinds, overwrite=args.overwrite)
    echo(f"{args.protocol} protocol, {dataset.split_protocol} split: "
         + ", ".join(f"{s} {int((dataset.frame['split'] == s).sum()):,}" for s in ("train", "val", "test")))
    if main and (blocks := dataset.block_line()) is not None:
        echo(blocks)
    density = None
    if args.density_tiles:
        from geodbk.dataset.density import read_density_tiles

        density = read_density_tiles(args.density_tiles, dataset.region, buffer_deg=dataset.buffer_deg)
    elif args.protocol == "space-time" and (fixed := SAMPLE_TILES.get((str(dataset.region.code), "fixed"))):
        echo(f"note: no density layer; the README's tables fit {dataset.region.code} with its shipped fixed-broadband "
             f"tiles (--density-tiles {fixed}), which lower the NLL most at new places")
    elif args.protocol == "space-time":
        echo(f"note: no density layer; the README's tables fit every region with its fixed-broadband tiles, which "
             f"lower the NLL most at new places: --density-tiles fixed:{dataset.quarters[-1]} downloads Ookla's "
             f"global fixed file of that quarter once")
    results, models, failed = {}, {}, {}
    for kind in kinds:
        start = time.perf_counter()
        try:
            model = fit_dataset(
                dataset, kind, protocol=args.protocol, preset=preset,
                min_wavelength_m=MIN_WAVELENGTH_M if args.min_wavelength is None else args.min_wavelength,
                coordinate_jitter_m=args.coordinate_jitter, density_tiles=density, **overrides,
            )
            if main:
                results[kind] = evaluate_targets(model, dataset)
        except Exception as err:  # the other kinds go on; Ctrl-C and SIGTERM stop the fit
            if is_worker():  # torchrun workers train in step: one that went on alone would wait forever
                raise
            failed[kind] = err
            echo(f"{kind}: failed after {time.perf_counter() - start:.0f} s")
            continue
        models[kind] = model
        averaged = "" if model.kriging is None else ", averaged with its kriging part"
        echo(f"{kind}: best epoch {model.regressor.best_epoch}/{len(model.regressor.history)}{averaged}, "
             f"{time.perf_counter() - start:.0f} s")
    if not main:
        return 0
    if not models:
        raise next(iter(failed.values()))
    # saved once every kind has finished or failed, models and metrics together under the folder's
    # lock: a killed fit leaves the run folder as it was, and earlier models' rows are kept
    table = run.save_fits(dataset, models, results, overwrite=args.overwrite, geometry_from=args.dataset)
    echo(metrics_heading(dataset))
    echo(format_metrics_table(table))
    for line in (*pair_correlations(models), *metrics_notes(table, dataset)):
        echo(line)
    return _failed_kinds(args, failed, list(models)) if failed else 0


def _failed_kinds(args: argparse.Namespace, failed: dict[str, Exception], saved: list[str]) -> int:
    """End a fit whose kinds ``failed`` (kind -> error) while those ``saved`` were written: one
    error line naming each failed kind and why (the traceback of the first with --debug), and the
    exit status of the worst failure (:func:`geodbk.cli.failures.failure`: 1 if one was a bug)."""
    from geodbk.cli.failures import INTERNAL_ERROR, USAGE_ERROR, failure

    if getattr(args, "debug", False):
        raise next(iter(failed.values()))
    outcomes = {kind: failure(err) for kind, err in failed.items()}
    reasons = "; ".join(f"{kind} failed: {text.removeprefix(f'{kind}: ')}" for kind, (_, text) in outcomes.items())
    print(f"geodbk fit: error: {reasons}; the fits of {', '.join(saved)} were saved in {args.out}", file=sys.stderr)
    return INTERNAL_ERROR if any(status == INTERNAL_ERROR for status, _ in outcomes.values()) else USAGE_ERROR


