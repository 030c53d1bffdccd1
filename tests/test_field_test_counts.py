"""The residual field's slope in 1/tests (geodbk.fit.residuals): estimated from the training
residuals, taken out of every row before kriging, kept for new rows and through a save."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geodbk.fit.residuals import ResidualField, fit_tests_slope
from geodbk.ingest.quadkey import lonlat_to_quadkey, quadkey_centres

#: The true slope of a row's log speed in 1/tests (one-test rows this much below a row of many tests).
SLOPE = -0.3


def test_the_slope_is_the_least_squares_slope_on_the_inverse_test_count() -> None:
    rng = np.random.default_rng(0)
    tests = rng.choice([1.0, 2.0, 5.0, 40.0], size=20_000)
    centre = float(np.mean(1.0 / tests))
    residual = SLOPE * (1.0 / tests - centre) + rng.normal(0.0, 0.3, tests.size)
    slope, found_centre = fit_tests_slope(residual, tests)
    assert found_centre == pytest.approx(centre, rel=1e-12)
    assert slope == pytest.approx(SLOPE, abs=0.01)  # its standard error here is 0.0055
    design = np.column_stack([np.ones_like(tests), 1.0 / tests])
    assert slope == pytest.approx(np.linalg.lstsq(design, residual, rcond=None)[0][1], rel=1e-9)
    assert fit_tests_slope(residual, np.full(tests.size, 3.0)) == (0.0, pytest.approx(1.0 / 3.0))


@pytest.fixture(scope="module")
def two_sides():
    """About 300 tiles in a 21 x 11 km box, four quarters each. Tiles share nothing but their own
    offset (sd 0.2, constant over time), so a tile's other quarters are what tells it; the
    western half is mostly one-test rows and the eastern mostly rows of 30 tests, and a row's
    residual is its tile's offset plus SLOPE (1/tests - c) plus noise. Training rows: quarters
    1-3; validation: quarter 4 of a third of the tiles; test: quarter 4 of the rest."""
    rng = np.random.default_rng(1)
    lon = -66.30 + rng.uniform(0.0, 0.2, 400)
    lat = 18.30 + rng.uniform(0.0, 0.1, 400)
    keys = np.array([lonlat_to_quadkey(a, b) for a, b in zip(lon, lat, strict=True)])
    keys, first = np.unique(keys, return_index=True)
    west = lon[first] < -66.20
    offset = rng.normal(0.0, 0.2, keys.size)
    rows = np.repeat(np.arange(keys.size), 4)
    quarter = np.tile(np.arange(4), keys.size)
    mostly_one = np.where(west[rows], 0.9, 0.1)
    tests = np.where(rng.uniform(size=rows.size) < mostly_one, 1.0, 30.0)
    centre = float(np.mean(1.0 / tests[quarter < 3]))
    truth = offset[rows]
    residual = truth + SLOPE * (1.0 / tests - centre) + rng.normal(0.0, 0.05, rows.size)
    lonlat, years = quadkey_centres(keys)[rows], 2022.125 + 0.25 * quarter
    noise = np.full(rows.size, 0.0025)
    part = np.where(quarter < 3, "train", np.where(rows % 3 == 0, "val", "test"))
    return {name: (lonlat[part == name], years[part == name], residual[part == name], noise[part == name],
                   tests[part == name], truth[part == name], west[rows][part == name])
            for name in ("train", "val", "test")}


def _fit(two_sides, with_tests: bool) -> ResidualField:
    (*train, train_tests, _, _), (*val, val_tests, _, _) = two_sides["train"], two_sides["val"]
    counts = {"train_tests": train_tests, "val_tests": val_tests} if with_tests else {}
    return ResidualField.fit(*train, *val, **counts)


def test_the_field_spreads_tile_offsets_free_of_a_neighbourhoods_test_counts(two_sides) -> None:
    """Kriged at a tile's next quarter, the field should give the tile's offset at the training rows'
    mean 1/tests. Without the slope taken out, the west's tiles (mostly one-test rows) come out
    low by about SLOPE (0.9 - 0.5) and the east's high by as much; with it, neither is off."""
    lonlat, years, _, _, _, truth, west = two_sides["test"]
    plain, adjusted = _fit(two_sides, False), _fit(two_sides, True)
    assert adjusted.tests_slope == pytest.approx(SLOPE, abs=0.06)  # seen -0.271; standard error about 0.02
    assert plain.tests_slope == 0.0
    plain_error = plain.condition(lonlat, years)[0] - truth
    adjusted_error = adjusted.condition(lonlat, years)[0] - truth
    # seen: plain -0.096 (west) and +0.112 (east), adjusted -0.007 and +0.011 (the slope -0.271);
    # squared error 0.0162 and 0.0014
    assert plain_error[west].mean() < -0.07 and plain_error[~west].mean() > 0.07
    assert abs(adjusted_error[west].mean()) < 0.03 and abs(adjusted_error[~west].mean()) < 0.03
    assert np.mean(adjusted_error**2) < 0.5 * np.mean(plain_error**2)


def test_new_rows_enter_with_the_fields_slope_and_it_survives_a_save(two_sides, tmp_path) -> None:
    field = _fit(two_sides, True)
    lonlat, years, residual, noise, tests, _, _ = two_sides["test"]
    grown = field.with_rows(lonlat[:50], years[:50], residual[:50], noise[:50], np.zeros(50), tests[:50])
    expected = residual[:50] - field.tests_slope * (1.0 / tests[:50] - field.tests_centre)
    np.testing.assert_allclose(grown.residual[-50:], expected, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(grown.residual[:-50], field.residual)
    assert (grown.tests_slope, grown.tests_centre) == (field.tests_slope, field.tests_centre)
    torch.save(grown.to_payload(), tmp_path / "field.pt")
    back = ResidualField.from_payload(torch.load(tmp_path / "field.pt", weights_only=True))
    assert (back.tests_slope, back.tests_centre) == (field.tests_slope, field.tests_centre)
    np.testing.assert_array_equal(back.adjusted(residual, tests), grown.adjusted(residual, tests))
    old = grown.to_payload()
    del old["tests_slope"], old["tests_centre"]  # a field saved before the slope took none out
    assert ResidualField.from_payload(old).adjusted(residual, tests).tolist() == residual.tolist()


def test_the_counts_of_both_row_sets_or_of_neither(two_sides) -> None:
    (*train, train_tests, _, _), (*val, _, _, _) = two_sides["train"], two_sides["val"]
    with pytest.raises(ValueError, match="both the training and the validation rows, or of neither"):
        ResidualField.fit(*train, *val, train_tests=train_tests)
