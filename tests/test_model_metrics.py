"""Metric functions against hand-computed values."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from geodbk.errors import InputDataError
from geodbk.fit.metrics import (
    baseline_note,
    coverage95,
    crps,
    evaluate,
    format_metrics_table,
    mae,
    metrics_table,
    nll,
    pi_width,
    save_metrics,
)
from geodbk.prediction import Prediction


def test_prediction_interval_properties():
    p = Prediction(np.array([1.0, -2.0]), np.array([0.5, 2.0]))
    # 1.959964 is the standard normal's 0.975 quantile to 7 digits
    np.testing.assert_allclose(p.lower, [1 - 1.959964 * 0.5, -2 - 1.959964 * 2], rtol=1e-6)
    np.testing.assert_allclose(p.upper, [1 + 1.959964 * 0.5, -2 + 1.959964 * 2], rtol=1e-6)
    np.testing.assert_allclose(p.pi_width, [1.959964, 4 * 1.959964], rtol=1e-6)
    np.testing.assert_allclose(p.var, [0.25, 4.0])


def test_crps_of_standard_normal_at_its_mean():
    p = Prediction(np.zeros(1), np.ones(1))
    assert crps(np.zeros(1), p) == pytest.approx((math.sqrt(2) - 1) / math.sqrt(math.pi), rel=1e-12)


def test_crps_matches_the_defining_integral():
    from scipy.stats import norm

    mu, sd, y = 0.3, 1.7, 1.9
    below = np.linspace(mu - 15 * sd, y, 200_001)  # split at y, where the step sits
    above = np.linspace(y, mu + 15 * sd, 200_001)
    numeric = np.trapezoid(norm.cdf(below, mu, sd) ** 2, below) + np.trapezoid((1 - norm.cdf(above, mu, sd)) ** 2, above)
    assert crps(np.array([y]), Prediction(np.array([mu]), np.array([sd]))) == pytest.approx(numeric, rel=1e-6)


def test_nll_mae_coverage_and_width_by_hand():
    y = np.array([0.0, 1.0, 3.0, -1.0])
    p = Prediction(np.array([0.0, 0.0, 0.0, 0.0]), np.array([1.0, 1.0, 1.0, 2.0]))
    assert mae(y, p) == pytest.approx(5 / 4)
    half_log_2pi = 0.5 * math.log(2 * math.pi)
    expected_nll = np.mean([half_log_2pi, half_log_2pi + 0.5, half_log_2pi + 4.5, half_log_2pi + math.log(2) + 0.125])
    assert nll(y, p) == pytest.approx(expected_nll)
    assert coverage95(y, p) == pytest.approx(3 / 4)  # 3 > 1.96 is the only miss
    assert pi_width(p) == pytest.approx(2 * 1.959964 * 5 / 4)


def test_evaluate_by_urban_rural_and_tables(tmp_path):
    y = np.array([0.0, 1.0, 3.0, -1.0, 0.5])
    p = Prediction(np.zeros(5), np.ones(5))
    groups = np.array(["urban", "rural", "urban", "rural", "urban"])
    frame = evaluate(y, p, groups)
    assert list(frame.index) == ["overall", "urban", "rural"]
    assert list(frame.columns) == ["n", "MAE", "NLL", "CRPS", "coverage95", "pi_width"]
    assert frame.loc["urban", "n"] == 3 and frame.loc["rural", "n"] == 2
    assert frame.loc["urban", "MAE"] == pytest.approx(3.5 / 3)
    assert frame.loc["rural", "coverage95"] == 1.0
    assert list(evaluate(y, p).index) == ["overall"]
    with pytest.raises(InputDataError):
        evaluate(y[:4], p)

    table = metrics_table({"dbk-rbf": frame, "sv-rbf": evaluate(y, p)})
    assert list(table.columns) == ["model", "group", "n", "MAE", "NLL", "CRPS", "coverage95", "pi_width"]
    assert len(table) == 4
    text = format_metrics_table(table)
    assert "dbk-rbf" in text and "%" in text
    csv_path, json_path = save_metrics(table, tmp_path / "run")
    pd.testing.assert_frame_equal(pd.read_csv(csv_path), table, check_dtype=False)
    records = json.loads(json_path.read_text())
    assert records[1]["group"] == "urban" and records[1]["n"] == 3


def test_the_baseline_note_reads_the_first_targets_rows():
    """With a ``target`` column (a download,upload model's rows), the note compares the models on
    the first target: an upload row worse than knn's download row is not named."""
    y = np.random.default_rng(1).normal(size=2000)
    zeros = np.zeros_like(y)
    good, poor = evaluate(y, Prediction(zeros, np.ones_like(y))), evaluate(y, Prediction(zeros + 3.0, np.ones_like(y)))
    results = {"dbk-rbf": pd.concat([good.assign(target="download"), poor.assign(target="upload")]),
               "knn": evaluate(y, Prediction(zeros, np.full_like(y, 2.0))).assign(target="download")}
    table = metrics_table(results)
    assert list(table["target"]) == ["download", "upload", "download"]
    assert baseline_note(table) is None
    upload_first = pd.concat([table[table["target"] == "upload"], table[table["model"] == "knn"].assign(target="upload")])
    assert "dbk-rbf (" in baseline_note(upload_first)  # the same rows, upload first: now it is named


def test_baseline_note_names_the_models_the_nearest_tiles_average_beats():
    """Truth y ~ N(0, 1): a model that predicts it with sd 1 beats a knn row predicting with sd 3,
    which beats a model 2 sd off the mean; the note names only the last, with both overall NLLs."""
    rng = np.random.default_rng(0)
    y = rng.normal(size=4000)
    groups = np.where(np.arange(4000) % 2 == 0, "urban", "rural")
    zeros = np.zeros_like(y)
    results = {
        "dbk-rbf": evaluate(y, Prediction(zeros, np.ones_like(y)), groups),
        "knn": evaluate(y, Prediction(zeros, np.full_like(y, 3.0)), groups),
        "sv-rbf": evaluate(y, Prediction(zeros + 2.0, np.ones_like(y)), groups),
    }
    table = metrics_table(results)
    note = baseline_note(table)
    overall = table[table["group"] == "overall"].set_index("model")["NLL"]
    assert overall["dbk-rbf"] < overall["knn"] < overall["sv-rbf"]
    assert note is not None and note.startswith("note: the nearest-tiles average (knn, NLL ")
    assert f"sv-rbf ({overall['sv-rbf']:.3f})" in note and f"NLL {overall['knn']:.3f}" in note
    assert "dbk-rbf" not in note
    assert baseline_note(metrics_table({k: results[k] for k in ("dbk-rbf", "knn")})) is None
    assert baseline_note(metrics_table({k: results[k] for k in ("dbk-rbf", "sv-rbf")})) is None  # no baseline row
    repeated = pd.concat([metrics_table({"knn": results["dbk-rbf"]}), table], ignore_index=True)  # an older knn row
    assert baseline_note(repeated) == note  # the latest row of a model counts
