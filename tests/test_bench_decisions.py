"""benchmarks/bench_decisions.py --quick: every table is printed with its columns, and its
probabilities lie in [0, 1] (two quarters of PR, a tiny dbk-rbf, the LightGBM pair, one budget)."""

from __future__ import annotations

import io
import re
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_decisions  # noqa: E402  # benchmarks/bench_decisions.py, not a package


def _table(text: str, title: str) -> list[list[str]]:
    """The whitespace-split lines of the table printed after the line starting with ``title``."""
    block = text.split(title, 1)[1].split("\n\n", 2)[1]
    return [line.split() for line in block.strip().splitlines()]


@pytest.mark.slow
def test_quick_run_prints_every_table() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        bench_decisions.main(["--quick"])  # the exit code is the goals', not asserted on a tiny model
    text = out.getvalue()

    tiles = _table(text, "## PR: tiles")
    header = tiles[0]
    assert header[:5] == ["split", "benchmark", "n", "share", "ECE"]
    for name in ("ECE_indep", "ECE_lightgbm", "Brier", "Brier_indep", "Brier_lightgbm", "ratio_indep",
                 "ratio_lightgbm", "p_min", "p_max", "fit_s", "lightgbm_s"):
        assert name in header
    rows = [dict(zip(header, row, strict=True)) for row in tiles[1:]]
    assert [(r["split"], r["benchmark"]) for r in rows] == [("spatial-block", b) for b in bench_decisions.BENCHMARKS]
    for r in rows:
        assert int(r["n"]) > 100
        assert 0.0 <= float(r["p_min"]) <= float(r["p_max"]) <= 1.0
        assert all(0.0 <= float(r[c]) <= 1.0 for c in ("share", "ECE", "Brier", "Brier_indep", "Brier_lightgbm"))

    titles = [f"PR {kind}, geodbk P(meets {name})" for kind in ("tiles", "hexagons (latest quarter)",
                                                             "hexagons (all quarters)")
              for name in bench_decisions.BENCHMARKS]
    for title in titles:
        table = _table(text, title)
        assert table[0] == ["spatial-block"] and table[1] == ["n", "mean_p", "observed"]
        bins = table[3:]
        assert [b[0] for b in bins] == [f"{k / 10:.1f}-{(k + 1) / 10:.1f}" for k in range(10)]
        for k, (_, n, mean_p, observed) in enumerate(bins):
            assert (n == "0") == (mean_p == "NaN") == (observed == "NaN")
            if n != "0":  # printed to 3 decimals
                assert k / 10 - 5e-4 <= float(mean_p) <= (k + 1) / 10 + 5e-4
                assert 0.0 <= float(observed) <= 1.0

    hexes = _table(text, "## PR: resolution-8 hexagons")
    assert hexes[0] == ["split", "benchmark", "quarters", "n_quarters", "hexagons", "tiles", "share", "ECE", "Brier",
                        "Brier_indep", "p_min", "p_max", "ratio_indep"]
    assert [(row[2], row[3]) for row in hexes[1:]] == [("2023Q3", "1")] * 2 + [("all", "2")] * 2
    for row in hexes[1:]:
        r = dict(zip(hexes[0], row, strict=True))
        assert int(r["hexagons"]) > 10 and int(r["tiles"]) >= 2 * int(r["hexagons"])
        assert 0.0 <= float(r["p_min"]) <= float(r["p_max"]) <= 1.0

    planning = _table(text, "## Planning (spatial-block)")
    assert planning[0] == ["region", "seed", "N", "hexagons", "wrong_before", "plan", "uncertain", "random",
                           "vs_random", "vs_uncertain", "fixed_plan", "fixed_random", "fixed_uncertain"]
    budget = bench_decisions.QUICK["budgets"]
    assert len(planning) == 2 and planning[1][:3] == ["PR", "0", budget]
    r = dict(zip(planning[0], planning[1], strict=True))
    for name in ("plan", "uncertain", "random"):
        assert 0.0 <= float(r[name]) <= int(r["hexagons"])
    assert re.search(rf"^(PASS|FAIL)  PR N={budget} planning", text, re.MULTILINE)
    assert re.search(r"^seconds: PR geodbk fits \d+", text, re.MULTILINE)

