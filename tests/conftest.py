"""Shared fixtures built from the shipped real sample (data/, see geodbk.paths).

Session-scoped and read-only: do not mutate what they return (copy first).
"""

from __future__ import annotations

import geopandas as gpd
import pytest
import torch

from geodbk import paths
from geodbk.dataset.spatial_dataset import SpatialDataset, build_dataset
from geodbk.ingest.ookla import read_tiles


@pytest.fixture(scope="session")
def pr_tiles() -> gpd.GeoDataFrame:
    """All Puerto Rico mobile tiles of the shipped sample (2019Q1-2023Q4, truncated 2020Q2 dropped)."""
    return read_tiles(paths.PUERTO_RICO_MOBILE)


@pytest.fixture(scope="session")
def pr_tiles_2023q4(pr_tiles) -> gpd.GeoDataFrame:
    """Puerto Rico mobile tiles of 2023Q4 only (6,427 rows)."""
    return pr_tiles[(pr_tiles["year"] == 2023) & (pr_tiles["quarter"] == 4)].reset_index(drop=True)


@pytest.fixture(scope="session")
def pr_dataset(pr_tiles) -> SpatialDataset:
    """Small real dataset: Puerto Rico mobile download speed, 2023Q4, county urban route, seed 0.

    6,416 rows (5,132 train / 641 val / 643 test), x in [-1, 1]^2, y = log10(Mbps).
    """
    return build_dataset(pr_tiles, "PR", target="download", quarters="2023Q4", seed=0)


@pytest.fixture(scope="module")
def single_thread():
    """Torch on one thread for a test module (``pytestmark = pytest.mark.usefixtures("single_thread")``):
    the model tests use tiny tensors, where one thread is fastest and immune to oversubscription."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
