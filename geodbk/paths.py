"""Locations of the small real data sample shipped in the repository's ``data/`` folder."""

from __future__ import annotations

import os
from pathlib import Path

#: Folder with the shipped sample. ``GEODBK_DATA`` overrides it.
SAMPLE_DIR = Path(os.environ.get("GEODBK_DATA", Path(__file__).resolve().parents[1] / "data"))

PUERTO_RICO_MOBILE = SAMPLE_DIR / "puerto_rico_mobile_tiles_2019q1-2023q4.parquet"
HAWAII_MOBILE = SAMPLE_DIR / "hawaii_mobile_tiles_2019q1-2023q4.parquet"
#: Fixed-broadband tiles of the same regions: the mobile maps' density layer.
PUERTO_RICO_FIXED = SAMPLE_DIR / "puerto_rico_fixed_tiles_4quarters.parquet"
HAWAII_FIXED = SAMPLE_DIR / "hawaii_fixed_tiles_2019q1-2023q4.parquet"
HAWAII_MOBILE_GEOJSON_ZIP = SAMPLE_DIR / "hawaii-state_mobile_geojson_2020Q3_2023Q4.zip"
STATE_BOUNDARIES = SAMPLE_DIR / "cb_2018_us_state_20m.zip"
COUNTY_BOUNDARIES = SAMPLE_DIR / "cb_2018_us_county_20m.zip"
COUNTY_URBAN_TABLE = SAMPLE_DIR / "2020_UA_COUNTY_clean.csv"

#: Where downloads are cached; ``GEODBK_CACHE`` overrides it.
CACHE_DIR = Path(os.environ.get("GEODBK_CACHE", Path.home() / ".cache" / "geodbk"))
