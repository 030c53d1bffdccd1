"""Counties as regions (geodbk.ingest.boundaries): by name and state, by FIPS code, several
joined by '+', with one-line refusals for unknown and ambiguous names."""

import pytest
import shapely

from geodbk import paths
from geodbk.cli import main
from geodbk.dataset.spatial_dataset import SpatialDataset, sample_tiles_path
from geodbk.errors import RegionError
from geodbk.ingest.boundaries import county_boundaries
from geodbk.ingest.regions import load_region


def _county(geoid: str) -> shapely.Geometry:
    table = county_boundaries()
    return table.loc[table["GEOID"] == geoid, "geometry"].iloc[0]


@pytest.mark.parametrize("spec", ["Kauai, HI", "kauai county, hawaii", "KAUAI COUNTY, 15", "15007", 15007])
def test_a_county_by_name_and_state_or_by_fips(spec):
    region = load_region(spec)
    assert region.name == "Kauai County, HI" and region.code == "HI"
    assert region.geometry.equals(shapely.make_valid(_county("15007")))
    west, south, east, north = region.bounds
    assert -160.3 < west < -160.2 and -159.3 < east < -159.2 and 21.7 < south < 21.8 and 22.2 < north < 22.3


def test_counties_joined_by_plus_are_their_union_and_accents_do_not_matter():
    region = load_region("Vieques, PR+Culebra Municipio, PR")
    assert region.name == "Vieques Municipio, PR + Culebra Municipio, PR" and region.code == "PR"
    assert region.geometry.area == pytest.approx(_county("72147").area + _county("72049").area, rel=1e-9)
    assert load_region("mayaguez, pr").name == "Mayagüez Municipio, PR"
    assert load_region("72147+72049").geometry.equals(region.geometry)
    assert load_region("Kauai, HI+Kings, NY").code is None  # two states: no state code


def test_a_shared_name_needs_its_kind():
    ambiguous = "'Baltimore, MD' is ambiguous: say 'Baltimore County, MD' or 'Baltimore city, MD'"
    with pytest.raises(RegionError, match=ambiguous):
        load_region("Baltimore, MD")
    city, county = load_region("Baltimore city, MD"), load_region("Baltimore County, MD")
    assert city.name == "Baltimore city, MD" and county.name == "Baltimore County, MD"
    assert city.geometry.area < county.geometry.area / 5


@pytest.mark.parametrize(("spec", "message"), [
    ("Kauia, HI", "HI has no county of that name; closest: Kauai County, HI"),
    ("Kauai, XX", "unknown state 'XX' in county 'Kauai, XX'"),
    ("99999", "unknown county FIPS code '99999'"),
    (", HI", "write it as 'NAME, STATE'"),
    ("Kauai, HI+Mauii, HI", "unknown county 'Mauii, HI'"),
    ("Kauai", "a county\\? say 'Kauai County, HI'"),
])
def test_an_unknown_county_is_refused_in_one_line_with_a_hint(spec, message):
    with pytest.raises(RegionError, match=message) as caught:
        load_region(spec)
    assert "\n" not in str(caught.value)


def test_ingest_of_a_county_clips_the_states_shipped_sample(tmp_path, capsys):
    assert sample_tiles_path("Kauai, HI") == paths.HAWAII_MOBILE
    out = tmp_path / "kauai.parquet"
    assert main(["ingest", "--region", "Kauai, HI", "--quarters", "2023Q4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("SpatialDataset: Kauai County, HI, download (Mbps)")
    # Kauai's county urban share is above one half, so every tile is urban: the summary says so and why
    assert "no rural rows: the rural metrics will be empty (the county-share route tags whole counties" in printed
    dataset = SpatialDataset.load(out)
    assert dataset.region.name == "Kauai County, HI" and len(dataset.frame) > 100
    inside = shapely.contains_xy(load_region("Kauai, HI").buffered(0.01), dataset.frame["lon"], dataset.frame["lat"])
    assert inside.all()
    assert main(["ingest", "--region", "Kauia, HI", "--out", str(tmp_path / "no.parquet")]) == 2
    assert "closest: Kauai County, HI" in capsys.readouterr().err and not (tmp_path / "no.parquet").exists()


def test_ingest_outside_the_samples_says_how_to_give_tiles(tmp_path, capsys):
    assert main(["ingest", "--region", "Boone, MO", "--out", str(tmp_path / "boone.parquet")]) == 2
    err = capsys.readouterr().err
    assert "not 'Boone County, MO'; give its tiles: --tiles mobile:2023Q4 (Ookla's global file), FILE_OR_URL" in err and err.count("\n") == 1
    assert main(["ingest", "--region", "Boon, MO"]) == 2  # a misspelt county is refused as such, with no tile hint
    err = capsys.readouterr().err
    assert "closest: Boone County, MO" in err and "--tiles" not in err
