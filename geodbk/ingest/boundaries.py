"""Census states and counties by name or FIPS code, from the shipped 2018 1:20M boundaries.

A state is its name, USPS code or 2-digit FIPS code (:func:`lookup_state`). Counties
(:func:`lookup_counties`) serve as study regions too: ``"Kauai, HI"``, ``"15007"``,
``"Vieques, PR+Culebra, PR"``. A city, an island or a metro area is usually a county or a few
of them, and county names and FIPS codes are what a broadband office works in. So a region may
be given as counties of the shipped 2018 Census 1:20M county boundaries (3,220 counties and
county equivalents: parishes, boroughs, Puerto Rico's municipios, independent cities), joined
by ``+``. Each county is

* its 5-digit FIPS code (``GEOID``), e.g. ``"72147"``; or
* ``"NAME, STATE"``: the county's name, optionally with its kind (``"Kauai County, HI"``,
  ``"Vieques Municipio, PR"``, ``"Baltimore city, MD"``), and its state by USPS code, name or
  2-digit FIPS. Case and accents do not matter (``"Mayaguez, PR"`` is Mayagüez).

A name that two counties of the state share (Baltimore County and Baltimore city) needs its
kind. The region is the union of the county polygons, named after them.
"""

from __future__ import annotations

import difflib
import unicodedata
from functools import lru_cache

import geopandas as gpd
import pandas as pd

from geodbk import paths
from geodbk.errors import RegionError
from geodbk.ingest.vectorfiles import read_vector

#: Census LSAD codes of county equivalents and the word each is written with after the name.
COUNTY_KINDS = {
    "06": "County", "13": "Municipio", "15": "Parish", "25": "city", "04": "Borough",
    "05": "Census Area", "03": "City and Borough", "12": "Municipality",
}
#: Joins the counties of one region.
COUNTY_JOIN = "+"


@lru_cache(maxsize=1)
def state_boundaries() -> gpd.GeoDataFrame:
    """The shipped Census 2018 1:20M state boundaries, reprojected to EPSG:4326."""
    return read_vector(paths.STATE_BOUNDARIES, "state boundary").to_crs(4326)


def lookup_state(key: str) -> pd.Series | None:
    """The row of :func:`state_boundaries` (``NAME``, ``STUSPS``, ``STATEFP``, geometry) of the
    state ``key`` names (name in any case, USPS code, FIPS code with or without its leading
    zero), or ``None``."""
    states = state_boundaries()
    k = key.strip()
    match = (
        (states["NAME"].str.casefold() == k.casefold())
        | (states["STUSPS"].str.upper() == k.upper())
        | (states["STATEFP"] == (k.zfill(2) if k.isdigit() else k))
    )
    return states[match].iloc[0] if match.any() else None


@lru_cache(maxsize=1)
def county_boundaries() -> gpd.GeoDataFrame:
    """The shipped Census 2018 1:20M county boundaries in EPSG:4326, with a ``key`` column:
    the name without accents or case, for lookups."""
    counties = read_vector(paths.COUNTY_BOUNDARIES, "county boundary").to_crs(4326)
    counties["key"] = counties["NAME"].map(_folded)
    return counties


def _folded(text: str) -> str:
    """``text`` without accents, case or repeated spaces (``"Mayagüez"`` -> ``"mayaguez"``)."""
    plain = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    return " ".join(plain.casefold().split())


def _is_county_fips(text: str) -> bool:
    """Whether ``text`` is written as a county's 5-digit FIPS code (state 2 digits, county 3)."""
    return len(text) == 5 and text.isdigit()


def is_county_spec(spec: str) -> bool:
    """Whether ``spec`` is written as counties: a 5-digit FIPS code, ``NAME, STATE``, or several joined by ``+``."""
    text = spec.strip()
    return COUNTY_JOIN in text or "," in text or _is_county_fips(text)


def county_label(county: pd.Series, usps: str) -> str:
    """``"Kauai County, HI"``: a county's name, kind and state."""
    kind = COUNTY_KINDS.get(str(county["LSAD"]))
    return f"{county['NAME']}{'' if kind is None else ' ' + kind}, {usps}"


def lookup_counties(spec: str) -> tuple[str, gpd.GeoDataFrame, str]:
    """The counties that ``spec`` names (see the module docstring).

    Args:
        spec: counties joined by ``+``, each a FIPS code or ``"NAME, STATE"``.

    Returns:
        ``(name, counties, usps)``: the region's name (the counties' labels joined by ``" + "``),
        their rows of :func:`county_boundaries`, and their state's USPS code (``""`` when they
        lie in several states).

    Raises:
        RegionError: a county that is unknown or ambiguous, with the closest names.
    """
    table = county_boundaries()
    chosen = pd.DataFrame([_one_county(part.strip(), table) for part in spec.split(COUNTY_JOIN)])
    chosen = chosen.drop_duplicates("GEOID")
    usps = [_usps(str(statefp)) for statefp in chosen["STATEFP"]]
    labels = " + ".join(county_label(row, code) for (_, row), code in zip(chosen.iterrows(), usps, strict=True))
    return labels, gpd.GeoDataFrame(chosen, geometry="geometry", crs=table.crs), usps[0] if len(set(usps)) == 1 else ""


def _one_county(part: str, table: gpd.GeoDataFrame) -> pd.Series:
    """The row of one county: a FIPS code or ``"NAME[ KIND], STATE"``."""
    if _is_county_fips(part):
        match = table[table["GEOID"] == part]
        if match.empty:
            raise RegionError(f"unknown county FIPS code {part!r} (the 2018 Census county boundaries have none)")
        return match.iloc[0]
    name, comma, state_text = part.rpartition(",")
    if not comma or not name.strip():
        raise RegionError(f"unknown county {part!r}: write it as 'NAME, STATE' (e.g. 'Kauai, HI') or a FIPS code")
    state = lookup_state(state_text.strip())
    if state is None:
        raise RegionError(f"unknown state {state_text.strip()!r} in county {part!r}")
    in_state = table[table["STATEFP"] == state["STATEFP"]]
    key, lsad = _folded(name), None
    for code, kind in COUNTY_KINDS.items():
        word = _folded(kind)
        if key.endswith(" " + word) and (in_state["key"] == key[: -len(word) - 1]).any():
            key, lsad = key[: -len(word) - 1], code
            break
    match = in_state[(in_state["key"] == key) & ((in_state["LSAD"] == lsad) if lsad else True)]
    usps = str(state["STUSPS"])
    if match.empty:
        close = difflib.get_close_matches(key, in_state["key"].tolist(), n=3, cutoff=0.6)
        hint = "; closest: " + ", ".join(
            county_label(in_state[in_state["key"] == k].iloc[0], usps) for k in close) if close else ""
        raise RegionError(f"unknown county {part!r}: {usps} has no county of that name{hint}")
    if len(match) > 1:
        options = " or ".join(repr(county_label(row, usps)) for _, row in match.iterrows())
        raise RegionError(f"county {part!r} is ambiguous: say {options}")
    return match.iloc[0]


def counties_named(name: str) -> list[str]:
    """Labels (:func:`county_label`) of the counties called ``name`` in any state (case and
    accents ignored), at most five: the hint for a county given without its state."""
    table = county_boundaries()
    match = table[table["key"] == _folded(name)].head(5)
    return [county_label(row, _usps(row["STATEFP"])) for _, row in match.iterrows()]


def _usps(statefp: str) -> str:
    state = lookup_state(statefp)
    return "" if state is None else str(state["STUSPS"])
