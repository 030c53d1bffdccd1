"""The whole chain at US scale on one machine: ingest, fit, a national grid, every county's summary.

Data: Ookla-schema global quarterly files from :mod:`synthetic_ookla` (``--us-tiles`` mobile
tiles per quarter in the contiguous US, clustered around metros, inside ``--world-tiles`` of the
rest of the world), written once under ``--data`` and reused when their manifest matches.
Stages, each a fresh subprocess so that its wall time and peak RSS (``os.wait4``'s
``ru_maxrss`` of that child and its waited-for children) are its own:

=================  ==========================================================================
generate           the global files (skipped, and not shown, when reused)
ingest-ga          ``geodbk ingest --tiles <every quarter> --region GA``
ingest-conus       the same with the contiguous states' union (AK, HI and territories left out)
fit                :func:`geodbk.fit.fitting.fit_dataset` of dbk-rbf at the CPU preset
                   (h 64, r 128, batch 1024) on the CONUS dataset for one epoch, then the
                   conjugate posterior and the local residual field, as ``geodbk fit`` does;
                   the epoch is timed to its checkpoint (start of the fit to the end of epoch 1
                   with its validation pass), and the projection is 40 such epochs (the preset's
                   schedule) plus the rest
grid               ``geodbk predict`` of the CONUS at ``--grid-resolution`` in EPSG:5070 (equal
                   area) for the last quarter, streamed to Zarr
counties-ga        ``geodbk summarize`` of Georgia's 159 counties of the shipped county file at
                   ``--summary-resolution`` (with the CONUS model): a state's worth, to project from
grid-change        the grid with the change over the year before (``--change``) as well
counties           ``geodbk summarize`` of the whole county file (its polygons that meet the
                   CONUS: every contiguous-US county)
=================  ==========================================================================

The default size runs in a few minutes (20,000 US tiles a quarter, 5 quarters, a 10 km grid,
0.1-degree county cells). ``--full`` is the issue's size: 700,000 US tiles a quarter over the
20 quarters 2019Q1-2023Q4 (14 M US rows) inside 3.3 M tiles of the rest of the world (4 M-row
files, like Ookla's), a 1 km grid (about 8 M cells) and 0.01-degree county cells (about 1 km).

    python benchmarks/bench_us_scale.py                 # small, a few minutes
    python benchmarks/bench_us_scale.py --full          # the issue's size
    python benchmarks/bench_us_scale.py --only ingest-ga,counties
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from geodbk.quarters import Quarter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

#: Epochs of the CPU preset's full schedule (geodbk.models.config.PRESETS["cpu"]).
FULL_SCHEDULE_EPOCHS = 40
#: States outside the contiguous US (FIPS): Alaska, Hawaii and the territories.
NOT_CONTIGUOUS = ("02", "15", "60", "66", "69", "72", "78")
STAGES = ("generate", "ingest-ga", "ingest-conus", "fit", "grid", "counties-ga", "grid-change", "counties")


@dataclass(frozen=True)
class Size:
    """How big a run is: tiles per quarter, quarters, grid and summary resolutions."""

    us_tiles: int
    world_tiles: int
    quarters: tuple[str, ...]
    grid_resolution: str
    summary_resolution: str

    @property
    def tag(self) -> str:
        return f"us{self.us_tiles}-world{self.world_tiles}-{self.quarters[0]}-{self.quarters[-1]}"


def quarter_range(first: str, last: str) -> tuple[str, ...]:
    """Quarter labels from ``first`` to ``last`` inclusive (``"2019Q1"``, ``"2023Q4"``)."""
    quarter, end, out = Quarter.parse(first), Quarter.parse(last), []
    while quarter <= end:
        out.append(str(quarter))
        quarter = quarter.shift(1)
    return tuple(out)


SMALL = Size(20_000, 80_000, quarter_range("2022Q4", "2023Q4"), "10km", "0.1")
FULL = Size(700_000, 3_300_000, quarter_range("2019Q1", "2023Q4"), "1km", "0.01")


@dataclass(frozen=True)
class Measured:
    """One stage: wall seconds, peak RSS in MiB, exit status, and the lines it printed last."""

    stage: str
    seconds: float
    peak_mib: float
    status: int
    tail: str


def run_stage(stage: str, argv: Sequence[str], log: Path) -> Measured:
    """Run ``argv`` as a child process (output to ``log``) and measure it with ``os.wait4``."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with open(log, "w") as out:
        start = time.perf_counter()
        child = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    tail = "\n".join(log.read_text().strip().splitlines()[-3:])
    return Measured(stage, seconds, usage.ru_maxrss / 1024.0, child.returncode, tail)


def geodbk(*args: str) -> list[str]:
    return [sys.executable, "-m", "geodbk", *args]


def this_script(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *args]


# --- stages that run through the Python API (in their own process, via --stage) ----------------
def stage_generate(folder: Path, size: Size) -> None:
    """Write the global files and a manifest that says what they are."""
    from synthetic_ookla import write_global_quarters

    files = write_global_quarters(folder, list(size.quarters), size.us_tiles, size.world_tiles, seed=0)
    manifest = {"tag": size.tag, "files": [p.name for p in files]}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def stage_conus(path: Path) -> None:
    """The contiguous US (the 48 states and DC) as one lon/lat polygon, written to ``path`` (GeoJSON)."""
    import geopandas as gpd

    from geodbk.ingest.boundaries import state_boundaries

    states = state_boundaries()
    conus = states[~states["STATEFP"].isin(NOT_CONTIGUOUS)].to_crs(4326)
    gpd.GeoDataFrame({"name": ["CONUS"]}, geometry=[conus.union_all()], crs=4326).to_file(path, driver="GeoJSON")


def stage_state_counties(path: Path, state: str) -> None:
    """The shipped county file's counties of ``state`` (FIPS code), written to ``path`` (GeoJSON)."""
    from geodbk.ingest.regions import read_polygons
    from geodbk.paths import COUNTY_BOUNDARIES

    counties = read_polygons(COUNTY_BOUNDARIES, what="polygon", keep_crs=True)
    counties[counties["STATEFP"] == state].to_file(path, driver="GeoJSON")


def stage_subsample(dataset: Path, out: Path, rows: int) -> None:
    """Every k-th row of the dataset file ``dataset`` (k chosen for about ``rows`` rows), written to
    ``out`` with the file's metadata (region, splits, urban/rural are kept as they were)."""
    import numpy as np
    import pyarrow.parquet as pq

    table = pq.read_table(dataset)
    step = max(1, -(-table.num_rows // rows))
    pq.write_table(table.take(np.arange(0, table.num_rows, step)), out)


def stage_fit(dataset: Path, model_path: Path, checkpoint: Path) -> None:
    """dbk-rbf at the CPU preset for one epoch (then the posterior and the residual field); prints
    the seconds to the end of epoch 1 (from the checkpoint's time) and in all."""
    from geodbk.dataset.spatial_dataset import SpatialDataset
    from geodbk.fit.fitting import fit_dataset

    data = SpatialDataset.load(dataset, geometry=False)  # as geodbk fit loads it
    start = time.time()  # the CPU preset, as geodbk fit uses it
    model = fit_dataset(data, "dbk-rbf", epochs=1, progress=False, device="cpu", checkpoint_path=str(checkpoint))
    total = time.time() - start
    model.save(model_path)
    epoch = checkpoint.stat().st_mtime - start
    rows = int((data.frame["split"] == "train").sum())
    print(json.dumps({"train_rows": rows, "epoch_s": epoch, "fit_s": total,
                      "projected_s": FULL_SCHEDULE_EPOCHS * epoch + (total - epoch)}))


# --- the driver ---------------------------------------------------------------------------------
def data_files(folder: Path, size: Size) -> list[Path] | None:
    """The global files under ``folder`` if its manifest says they are of ``size``, else None."""
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return None
    facts = json.loads(manifest.read_text())
    files = [folder / name for name in facts.get("files", [])]
    if facts.get("tag") != size.tag or not files or not all(p.is_file() for p in files):
        return None
    return files


def previous_year(quarter: str) -> str:
    return str(Quarter.parse(quarter).shift(-4))


def plan(size: Size, work: Path, files: list[Path], fit_rows: int | None) -> dict[str, list[str]]:
    """The command of every stage but ``generate``; the fit reads a subsample when ``fit_rows`` is given."""
    from geodbk.paths import COUNTY_BOUNDARIES

    tiles = [str(p) for p in files]
    last = size.quarters[-1]
    model = str(work / "dbk-rbf.pt")
    summarize = ["summarize", "--model", model, "--resolution", size.summary_resolution, "--quarter", last,
                 "--no-progress", "--overwrite"]
    predict = ["predict", "--model", model, "--region", str(work / "conus.geojson"), "--resolution",
               size.grid_resolution, "--crs", "EPSG:5070", "--quarter", last, "--no-progress", "--overwrite"]
    return {
        "ingest-ga": geodbk("ingest", "--tiles", *tiles, "--region", "GA", "--out", str(work / "ga.parquet"),
                            "--overwrite"),
        "ingest-conus": geodbk("ingest", "--tiles", *tiles, "--region", str(work / "conus.geojson"),
                               "--out", str(work / "conus.parquet"), "--overwrite"),
        "fit": this_script("--stage", "fit", str(work / ("conus-fit.parquet" if fit_rows else "conus.parquet")),
                           model, str(work / "fit.ckpt")),
        "grid": geodbk(*predict, "--out", str(work / "grid.zarr")),
        "grid-change": geodbk(*predict, "--change", f"{previous_year(last)}:{last}",
                              "--out", str(work / "change.zarr")),
        "counties-ga": geodbk(*summarize, "--polygons", str(work / "ga-counties.geojson"),
                              "--out", str(work / "counties-ga.parquet")),
        "counties": geodbk(*summarize, "--polygons", str(COUNTY_BOUNDARIES), "--out", str(work / "counties.parquet")),
    }


def describe(stage: str, measured: Measured, work: Path) -> str:
    """What a stage produced, in a few words (rows, cells, polygons, projections)."""
    import pyarrow.parquet as pq

    if measured.status != 0:
        return f"failed ({measured.status}): {measured.tail.splitlines()[-1] if measured.tail else ''}"
    if stage.startswith("ingest"):
        path = work / ("ga.parquet" if stage == "ingest-ga" else "conus.parquet")
        return f"{pq.ParquetFile(path).metadata.num_rows:,} rows"
    if stage == "fit":
        facts = json.loads(next(line for line in reversed(measured.tail.splitlines()) if line.startswith("{")))
        return (f"{facts['train_rows']:,} train rows; epoch 1 {facts['epoch_s']:.0f} s; "
                f"{FULL_SCHEDULE_EPOCHS} epochs projected {facts['projected_s'] / 60:.0f} min")
    if stage.startswith("grid"):
        from geodbk.maps.stores import open_grid

        ds = open_grid(work / ("grid.zarr" if stage == "grid" else "change.zarr"))
        inside = int(ds["mean"].notnull().sum())
        return f"{ds.sizes['y']} x {ds.sizes['x']} cells, {inside:,} inside, {len(ds.data_vars)} layers"
    if stage.startswith("counties"):
        table = pq.read_table(work / f"{stage}.parquet", columns=["cells"]).column("cells").to_numpy()
        return f"{len(table):,} counties, {int(table.sum()):,} cells"
    return ""


def print_table(size: Size, rows: list[tuple[Measured, str]]) -> None:
    print(f"\nsize: {size.us_tiles:,} US + {size.world_tiles:,} world tiles x {len(size.quarters)} quarters "
          f"({size.quarters[0]}-{size.quarters[-1]}); grid {size.grid_resolution}, "
          f"county cells {size.summary_resolution}; {os.cpu_count()} CPU cores")
    print(f"| {'stage':<13} | {'wall':>9} | {'peak RSS':>9} | result")
    print(f"|{'-' * 15}|{'-' * 11}|{'-' * 11}|{'-' * 40}")
    for measured, result in rows:
        print(f"| {measured.stage:<13} | {measured.seconds:>7.1f} s | {measured.peak_mib / 1024:>6.2f} GB | {result}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="the issue's size (see the module docstring)")
    parser.add_argument("--us-tiles", type=int, help="US tiles per quarter (overrides the size)")
    parser.add_argument("--world-tiles", type=int, help="rest-of-world tiles per quarter (overrides the size)")
    parser.add_argument("--quarters", help="FIRST:LAST quarters (overrides the size), e.g. 2022Q4:2023Q4")
    parser.add_argument("--grid-resolution", help="CONUS grid cell side, e.g. 1km (overrides the size)")
    parser.add_argument("--summary-resolution", help="county averaging cells, degrees (overrides the size)")
    parser.add_argument("--data", type=Path, default=Path("/tmp/us-scale-data"),
                        help="folder of the generated files (reused when they match; default /tmp/us-scale-data)")
    parser.add_argument("--fit-rows", type=int, metavar="N",
                        help="fit on every k-th row of the CONUS dataset, about N rows (default all)")
    parser.add_argument("--only", help=f"comma-separated stages to run, of {', '.join(STAGES)} (default all)")
    parser.add_argument("--stage", nargs="+", help=argparse.SUPPRESS)  # a stage's own process
    args = parser.parse_args(argv)
    if args.stage:
        name, *rest = args.stage
        {"fit": lambda: stage_fit(*map(Path, rest)), "conus": lambda: stage_conus(Path(rest[0])),
         "counties": lambda: stage_state_counties(Path(rest[0]), rest[1]),
         "subsample": lambda: stage_subsample(Path(rest[0]), Path(rest[1]), int(rest[2])),
         "generate": lambda: stage_generate(Path(rest[0]), _size_from_json(rest[1]))}[name]()
        return 0
    base = FULL if args.full else SMALL
    quarters = base.quarters if args.quarters is None else quarter_range(*args.quarters.split(":"))
    size = Size(args.us_tiles or base.us_tiles, args.world_tiles or base.world_tiles, quarters,
                args.grid_resolution or base.grid_resolution, args.summary_resolution or base.summary_resolution)
    wanted = STAGES if args.only is None else tuple(s.strip() for s in args.only.split(","))
    folder = args.data / size.tag
    work = folder / "work"
    work.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[Measured, str]] = []
    files = data_files(folder, size)
    if files is None:
        measured = run_stage("generate", this_script("--stage", "generate", str(folder), _size_json(size)),
                             work / "generate.log")
        files = data_files(folder, size)
        if measured.status != 0 or files is None:
            print(f"generating the data failed:\n{measured.tail}", file=sys.stderr)
            return 1
        rows.append((measured, f"{len(files)} files, {sum(p.stat().st_size for p in files) / 2**30:.1f} GiB"))
    if not (work / "conus.geojson").is_file():
        subprocess.run(this_script("--stage", "conus", str(work / "conus.geojson")), check=True)
    if not (work / "ga-counties.geojson").is_file():
        subprocess.run(this_script("--stage", "counties", str(work / "ga-counties.geojson"), "13"), check=True)
    commands = plan(size, work, files, args.fit_rows)
    for stage in STAGES[1:]:
        if stage not in wanted:
            continue
        if stage == "fit" and args.fit_rows:  # not timed: the subsample stands in for a smaller ingest
            subprocess.run(this_script("--stage", "subsample", str(work / "conus.parquet"),
                                       str(work / "conus-fit.parquet"), str(args.fit_rows)), check=True)
        measured = run_stage(stage, commands[stage], work / f"{stage}.log")
        rows.append((measured, describe(stage, measured, work)))
        print(f"{stage}: {measured.seconds:.1f} s, {measured.peak_mib / 1024:.2f} GB; {rows[-1][1]}", flush=True)
        if measured.status != 0:
            break
    print_table(size, rows)
    return 0 if all(m.status == 0 for m, _ in rows) else 1


def _size_json(size: Size) -> str:
    return json.dumps({**size.__dict__, "quarters": list(size.quarters)})


def _size_from_json(text: str) -> Size:
    facts = json.loads(text)
    return Size(**{**facts, "quarters": tuple(facts["quarters"])})


if __name__ == "__main__":
    sys.exit(main())
