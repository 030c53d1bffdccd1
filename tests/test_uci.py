"""The UCI loader on the shipped yacht / energy sets: shapes, fixed splits, scaling, errors."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from geodbk.errors import InputDataError
from geodbk.ingest.uci import SHIPPED_UCI_DIR, UCIDataset, available_uci, load_uci


def test_shipped_sets_are_listed():
    assert {"yacht", "energy"} <= set(available_uci(SHIPPED_UCI_DIR))


@pytest.mark.parametrize("name, n, d", [("yacht", 308, 6), ("energy", 768, 8)])
def test_load_shapes_and_masks(name, n, d):
    data = load_uci(name)
    assert data.X.shape == (n, d) and data.y.shape == (n,)
    assert data.test_mask.shape == (n, 10) and data.test_mask.dtype == bool
    # These sets ship as 10 folds: every row is a test row of exactly one split.
    assert (data.test_mask.sum(axis=1) == 1).all()
    assert np.all(np.abs(data.test_mask.sum(axis=0) - n / 10) < 1)


def test_yacht_first_row_matches_the_file():
    with gzip.open(SHIPPED_UCI_DIR / "yacht" / "data.csv.gz", "rt") as fh:
        first = np.array([float(v) for v in fh.readline().split(",")])
    data = load_uci("yacht")
    np.testing.assert_array_equal(data.X[0], first[:-1])
    assert data.y[0] == first[-1]


def test_split_partitions_and_scales_with_training_statistics():
    data = load_uci("yacht")
    s = data.split(3, val_fraction=0.1, seed=0)
    n_test = int(data.test_mask[:, 3].sum())
    assert len(s.y_test) == n_test
    assert len(s.y_train) + len(s.y_val) + len(s.y_test) == data.n
    assert len(s.y_val) == round(0.1 * (data.n - n_test))
    # inputs: training rows span exactly [-1, 1] in every non-constant column
    np.testing.assert_allclose(s.X_train.min(axis=0), -1.0, atol=1e-12)
    np.testing.assert_allclose(s.X_train.max(axis=0), 1.0, atol=1e-12)
    # targets standardised with the training rows
    assert abs(s.y_train.mean()) < 1e-12 and abs(s.y_train.std() - 1.0) < 1e-12
    # the test targets are the raw test rows, mapped back exactly
    np.testing.assert_allclose(s.to_original_units(s.y_test), data.y[data.test_mask[:, 3]], rtol=1e-12)


def test_split_rows_are_disjoint_and_seeded():
    # y = sin(row id) is unique per row, so the returned targets tell which rows went where
    n = 200
    mask = np.zeros((n, 10), dtype=bool)
    mask[np.arange(n), np.arange(n) % 10] = True
    data = UCIDataset("ids", X=np.arange(n, dtype=float)[:, None], y=np.sin(np.arange(n)), test_mask=mask)

    def ids(split):
        return [set(np.round(split.to_original_units(y), 12)) for y in (split.y_train, split.y_val, split.y_test)]

    train, val, test = ids(data.split(4, seed=0))
    assert not (train & val) and not (train & test) and not (val & test)
    assert test == set(np.round(np.sin(np.arange(4, n, 10)), 12))
    assert ids(data.split(4, seed=0))[1] == val
    assert ids(data.split(4, seed=1))[1] != val
    assert ids(data.split(4, seed=1))[2] == test  # test rows are fixed by the mask


def test_standardize_scaling_and_subsampling():
    data = load_uci("energy")
    s = data.split(1, scaling="standardize", max_train=100, max_test=20, seed=2)
    assert s.X_train.shape == (100, 8) and s.X_test.shape == (20, 8)
    np.testing.assert_allclose(s.X_train.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(s.X_train.std(axis=0), 1.0, atol=1e-12)


def test_errors_are_clear(tmp_path):
    with pytest.raises(InputDataError, match="available: .*yacht"):
        load_uci("no-such-set")
    with pytest.raises(InputDataError, match="out of range"):
        load_uci("yacht").split(10)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "data.csv.gz").write_bytes(gzip.compress(b"1,2,3\n4,5,6\n"))
    (bad / "test_mask.csv.gz").write_bytes(gzip.compress(b"0,1\n"))
    with pytest.raises(InputDataError, match="test_mask has 1 rows but data has 2"):
        load_uci("bad", root=tmp_path)
