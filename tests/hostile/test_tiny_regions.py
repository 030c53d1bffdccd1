"""Hostile tiny regions (issue 38): a dataset of one tile (all its quarters), of a region smaller than
one block, and of one quarter, through ``ingest --split``, ``fit`` and ``demo``.

Every case runs through the ``hostile`` harness (tests/hostile/conftest.py): exit 0, or exit 2 with
one error line; no pre-existing byte changed; no temporary left. On top of that, a split that leaves
too little to validate or test on is refused in one line that says what was found and what to pass
(each case gives a phrase of it), and a refused command writes nothing at its output.

The region smaller than one block is six tiles in a 1.3 km box in San Juan: the equal-area projection
of the split is centred on them, so any block side puts them in the two-by-two blocks around its
centre, one of them the validation set and one the test set.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from geodbk.cli import main
from geodbk.dataset.spatial_dataset import SpatialDataset
from geodbk.ingest.quadkey import quadkey_centres

#: Raw Ookla columns written to the tile files.
RAW = ["quadkey", "year", "quarter", "service", "avg_d_kbps", "avg_u_kbps", "avg_lat_ms", "tests", "devices"]
#: Centre (lon, lat) and half-width (degrees) of the region smaller than one block.
SAN_JUAN, HALF_WIDTH = (-66.06, 18.42), 0.006
TINY = ("one_tile", "one_block", "one_quarter")


@pytest.fixture(scope="module")
def root(tmp_path_factory, pr_tiles) -> Path:
    """The three tiny tile files and the datasets ``geodbk ingest`` writes of them (random split)."""
    root = tmp_path_factory.mktemp("hostile-tiny")
    raw = pd.DataFrame(pr_tiles[RAW])
    lonlat = quadkey_centres(raw["quadkey"].to_numpy(dtype=object))
    near = (np.abs(lonlat - SAN_JUAN) < HALF_WIDTH).all(axis=1)
    tiles = {
        "one_tile": raw[raw["quadkey"] == raw["quadkey"].value_counts().index[0]],
        "one_block": raw[near],
        "one_quarter": raw[(raw["year"] == 2023) & (raw["quarter"] == 4)],
    }
    assert tiles["one_tile"][["year", "quarter"]].drop_duplicates().shape[0] == 19
    assert tiles["one_block"]["quadkey"].nunique() == 6
    for name, rows in tiles.items():
        rows.reset_index(drop=True).to_parquet(root / f"{name}.parquet")
        assert main(["ingest", "--tiles", str(root / f"{name}.parquet"), "--region", "PR",
                     "--out", str(root / f"{name}_dataset.parquet")]) == 0
    (root / "out").mkdir()
    return root


def _ingest(name: str, *extra: str) -> Callable[[Path, Path], list]:
    return lambda r, out: ["ingest", "--tiles", r / f"{name}.parquet", "--region", "PR", "--out", out, *extra]


def _fit(name: str, *extra: str) -> Callable[[Path, Path], list]:
    return lambda r, out: ["fit", "--dataset", r / f"{name}_dataset.parquet", "--out", out, "--models", "knn",
                           "--no-progress", *extra]


def _demo(*extra: str) -> Callable[[Path, Path], list]:
    return lambda r, out: ["demo", "--out", out, "--models", "knn", "--quarters", "2023Q4", "--resolution", "0.1",
                           "--no-progress", *extra]


SPATIAL, FORECAST, RANDOM = ("--split", "spatial-block"), ("--split", "forecast"), ("--split", "random")
#: case -> (command line of (root, output path), phrase of the one-line refusal, or None for a success)
CASES: dict[str, tuple[Callable[[Path, Path], list], str | None]] = {
    # ingest: the split is made here
    "ingest one tile, spatial-block": (_ingest("one_tile", *SPATIAL), "only 1 block of 10 km; use smaller blocks"),
    "ingest one tile, 1 km blocks": (_ingest("one_tile", *SPATIAL, "--block-km", "1"), "only 1 block of 1 km"),
    "ingest one tile, forecast": (_ingest("one_tile", *FORECAST),
                                  "the forecast split of 19 rows leaves 2 validation rows and 1 test row"),
    "ingest one tile, random": (_ingest("one_tile", *RANDOM), "use more tiles or quarters"),
    "ingest one block, spatial-block": (_ingest("one_block", *SPATIAL),
                                        "leaves 1 validation block (38 rows) and 1 test block (38 rows) at 10 km"),
    "ingest one block, 2 km blocks": (_ingest("one_block", *SPATIAL, "--block-km", "2"), "at 2 km squares"),
    "ingest one block, forecast": (_ingest("one_block", *FORECAST), "use more tiles or quarters"),
    "ingest one quarter, forecast": (_ingest("one_quarter", *FORECAST), "needs 2 distinct quarters"),
    "ingest one quarter, 40 km blocks": (_ingest("one_quarter", *SPATIAL, "--block-km", "40"),
                                         "pass a smaller --block-km, or --split random"),
    "ingest one quarter, spatial-block": (_ingest("one_quarter", *SPATIAL), None),
    # fit: the dataset's own split, or a new one
    "fit one tile, its split": (_fit("one_tile"), "the random split of 19 rows leaves 1 validation row"),
    "fit one tile, spatial-block": (_fit("one_tile", *SPATIAL), "only 1 block"),
    "fit one tile, forecast": (_fit("one_tile", *FORECAST), "use more tiles or quarters"),
    "fit one block, its split": (_fit("one_block"), "the random split of 114 rows"),
    "fit one block, spatial-block": (_fit("one_block", *SPATIAL), "1 test block (38 rows)"),
    "fit one quarter, forecast": (_fit("one_quarter", *FORECAST), "needs 2 distinct quarters"),
    "fit one quarter, 20 km blocks": (_fit("one_quarter", *SPATIAL, "--block-km", "20"), "--block-km"),
    "fit one quarter, spatial-block": (_fit("one_quarter", *SPATIAL), None),
    # demo: the shipped sample's one quarter in blocks too large for it
    "demo one quarter, 40 km blocks": (_demo(*SPATIAL, "--block-km", "40"), "pass a smaller --block-km"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_a_tiny_region_is_refused_in_one_line_or_split_whole(hostile, root, case):
    make, phrase = CASES[case]
    out = root / "out" / case.replace(" ", "_").replace(",", "")
    argv = make(root, out)
    outcome = hostile(argv, root, may_change=[out], expect="ok" if phrase is None else "refused")
    if phrase is not None:
        assert phrase in outcome.stderr[-1], outcome.stderr[-1]
        assert not out.exists(), f"{case} left {out}"
        return
    written = SpatialDataset.load(out if argv[0] == "ingest" else out / "dataset.parquet")
    assert written.split_protocol == "spatial-block" and written.block_choice == "chosen"
    held = written.held_out_blocks()
    assert min(held["val"], held["test"]) >= 8


def test_ingest_without_a_split_writes_a_tiny_dataset_and_warns_that_fit_will_refuse_it(hostile, root, capsys):
    out = root / "out" / "one_tile_random.parquet"
    outcome = hostile(_ingest("one_tile")(root, out), root, may_change=[out], expect="ok")
    assert outcome.stderr == ["geodbk ingest: warning: geodbk fit will refuse this dataset's split: the random split "
                              "of 19 rows leaves 1 validation row and 3 test rows (at least 100 needed); use more "
                              "tiles or quarters"]
    assert len(SpatialDataset.load(out)) == 19


def test_fit_prints_the_chosen_blocks_and_that_few_test_blocks_are_noisy(root, capsys):
    capsys.readouterr()
    assert main([str(a) for a in _fit("one_quarter", *SPATIAL)(root, root / "out" / "printed")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert "spatial-block split: 10 km squares chosen for 6,416 rows (val 16 blocks, test 9 blocks)" in printed
    assert printed[-1].startswith("note: the test metrics come from only 9 blocks (")
    assert printed[-1].endswith("rows), so they are noisy; compare models over several --seed values")
