"""The names the README and the dashboard rely on resolve from the top-level package."""

import subprocess
import sys

import pytest

import geodbk


@pytest.mark.parametrize("name", geodbk.__all__)
def test_public_name_resolves(name):
    assert getattr(geodbk, name) is not None


def test_maps_are_made_by_the_model():
    """GeoModel.plan / GeoModel.grid make maps (predict_grid is the engine below them); predict_region,
    a second way with its arguments in another order, is gone."""
    assert "predict_region" not in geodbk.__all__ and "MapPlan" in geodbk.__all__
    assert callable(geodbk.GeoModel.plan) and callable(geodbk.GeoModel.grid)
    with pytest.raises(AttributeError, match="predict_region"):
        geodbk.predict_region


def test_unknown_name_raises_attribute_error():
    with pytest.raises(AttributeError, match="no_such_thing"):
        geodbk.no_such_thing


def test_import_is_light():
    """`import geodbk` must not pull torch: the CLI's --help stays fast."""
    code = "import sys, geodbk; print('torch' in sys.modules, 'geopandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_the_command_line_parser_is_built_without_torch():
    """Every subcommand's parser, the protocol choices of `fit` and `demo` among them
    (geodbk.dataset.protocols), is built without importing torch: `geodbk fit --help` stays fast."""
    code = "import sys; from geodbk.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]
