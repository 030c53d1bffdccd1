"""Observed tiles of a dataset frame (:attr:`geodbk.dataset.spatial_dataset.SpatialDataset.frame`):
the rows of one quarter, and the rows near a point for its time series.

The frame has one row per tile-quarter with ``lon``/``lat`` (tile centre, degrees), ``year``,
``quarter`` (1-4), ``value`` (data units, Mbps or ms) and, for a run's dataset, ``tests``,
``split``, ``urban_rural`` and the tile ``geometry``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from geodbk.quarters import Quarter

#: Observed tiles within this distance (km) of a clicked point are drawn on its time series.
NEAR_KM = 1.0
#: The observed-tiles quarter choice that shows every quarter.
ALL_QUARTERS = "all quarters"
#: Mean Earth radius (km), for great-circle distances.
EARTH_RADIUS_KM = 6371.0088
#: Columns of the shown-tiles GeoJSON download.
GEOJSON_COLUMNS = ("quadkey", "year", "quarter", "value", "urban_rural", "split", "geometry")


def tiles_in_quarter(frame: pd.DataFrame, quarter: str) -> pd.DataFrame:
    """Rows of ``quarter`` (``"2023Q4"``), or every row for :data:`ALL_QUARTERS`."""
    if quarter == ALL_QUARTERS:
        return frame
    shown = Quarter.parse(quarter)
    return frame[(frame["year"] == shown.year) & (frame["quarter"] == shown.number)]


def tiles_geojson(frame: pd.DataFrame | None) -> str:
    """GeoJSON text of the tiles (a GeoDataFrame's :data:`GEOJSON_COLUMNS`); an empty
    FeatureCollection for ``None``."""
    if frame is None:
        return '{"type": "FeatureCollection", "features": []}'
    return frame[list(GEOJSON_COLUMNS)].to_json()


def quarter_dates(quarters: Sequence[Quarter] | pd.Series) -> pd.DatetimeIndex:
    """First day of each quarter (2023Q4 -> 2023-10-01; a Series holds labels, a frame's
    ``quarter_label`` column), the time axis of a series."""
    return pd.DatetimeIndex([pd.Timestamp(Quarter.parse(quarter).start) for quarter in quarters])


def distance_km(lon: np.ndarray, lat: np.ndarray, lon0: float, lat0: float) -> np.ndarray:
    """Great-circle distance (km, haversine) from ``(lon0, lat0)`` to each point; degrees in,
    ``lon``/``lat`` any (equal) shape, the result shaped like them."""
    phi, phi0 = np.radians(lat), np.radians(lat0)
    half = np.sin((phi - phi0) / 2) ** 2 + np.cos(phi) * np.cos(phi0) * np.sin(np.radians(lon - lon0) / 2) ** 2
    return 2 * EARTH_RADIUS_KM * np.arcsin(np.sqrt(np.clip(half, 0.0, 1.0)))


def observed_near(frame: pd.DataFrame, lon: float, lat: float, radius_km: float = NEAR_KM) -> pd.DataFrame:
    """Observed tiles (every split) whose centre is within ``radius_km`` of the point (degrees):
    columns ``quarter_start, quarter_label, observed_value, tests, split, distance_km``."""
    near = frame.assign(distance_km=distance_km(frame["lon"].to_numpy(), frame["lat"].to_numpy(), lon, lat))
    near = near[near["distance_km"] <= radius_km]
    labels = pd.Series([str(Quarter(int(y), int(q))) for y, q in zip(near["year"], near["quarter"], strict=True)],
                       index=near.index, dtype=object)
    return pd.DataFrame(
        {
            "quarter_start": quarter_dates(labels) if len(near) else pd.DatetimeIndex([]),
            "quarter_label": labels.to_numpy(),
            "observed_value": near["value"].to_numpy(np.float64),
            "tests": near["tests"].to_numpy() if "tests" in near else np.zeros(len(near)),
            "split": near["split"].astype(str).to_numpy() if "split" in near else np.full(len(near), ""),
            "distance_km": near["distance_km"].to_numpy(),
        }
    )
