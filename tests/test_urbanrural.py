"""Urban/rural tagging by urban-area polygons and by county urban share."""

import functools
import http.server
import threading

import geopandas as gpd
import numpy as np
import pytest
import shapely

from geodbk.errors import InputDataError
from geodbk.ingest.quadkey import quadkey_centres
from geodbk.ingest.sources import cache_path
from geodbk.ingest.urbanrural import ROUTE_URBAN_AREAS, county_urban_share, tag_urban_rural

SAN_JUAN_AREA = ["72127", "72061", "72021", "72031", "72033"]  # San Juan, Guaynabo, Bayamón, Carolina, Cataño


@pytest.fixture(scope="module")
def pr_counties() -> gpd.GeoDataFrame:
    counties = county_urban_share()
    return counties[counties["GEOID"].str.startswith("72")]


@pytest.fixture(scope="module")
def centres(pr_tiles_2023q4) -> np.ndarray:
    return quadkey_centres(pr_tiles_2023q4["quadkey"].to_numpy(dtype=object))


def test_urban_area_polygons_route(pr_tiles_2023q4, pr_counties, centres, tmp_path):
    metro = pr_counties[pr_counties["GEOID"].isin(SAN_JUAN_AREA)]
    assert len(metro) == 5
    path = tmp_path / "san_juan_area.geojson"
    gpd.GeoDataFrame(geometry=[metro.geometry.union_all()], crs=4326).to_crs(3857).to_file(path)
    tagged, route = tag_urban_rural(pr_tiles_2023q4, urban_areas=path)
    assert route == ROUTE_URBAN_AREAS
    expected = np.zeros(len(centres), dtype=bool)
    for poly in metro.geometry:  # independent check, county by county
        expected |= shapely.contains_xy(poly, centres[:, 0], centres[:, 1])
    got = tagged["urban_rural"].to_numpy() == "urban"
    # A centre exactly on a shared county border may differ after reprojection; allow a handful.
    assert (got != expected).sum() <= 3
    assert 500 < got.sum() < len(got) - 500
    assert set(tagged["urban_rural"]) == {"urban", "rural"}
    # The same polygons as an in-memory GeoDataFrame give the same labels.
    again, _ = tag_urban_rural(pr_tiles_2023q4, urban_areas=gpd.read_file(path))
    assert (again["urban_rural"] == tagged["urban_rural"]).all()


def test_urban_areas_by_url_are_downloaded_once_into_the_cache(pr_tiles_2023q4, pr_counties, tmp_path):
    www, cache = tmp_path / "www", tmp_path / "cache"
    www.mkdir()
    metro = pr_counties[pr_counties["GEOID"].isin(SAN_JUAN_AREA)]
    gpd.GeoDataFrame(geometry=[metro.geometry.union_all()], crs=4326).to_file(www / "ua.geojson")
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            requests.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(www)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/ua.geojson"
        by_url, route = tag_urban_rural(pr_tiles_2023q4, urban_areas=url, cache_dir=cache)
        again, _ = tag_urban_rural(pr_tiles_2023q4, urban_areas=url, cache_dir=cache)
    finally:
        server.shutdown()
        server.server_close()
    assert route == ROUTE_URBAN_AREAS and requests == ["/ua.geojson"]
    assert cache_path(url, cache).read_bytes() == (www / "ua.geojson").read_bytes()
    local, _ = tag_urban_rural(pr_tiles_2023q4, urban_areas=www / "ua.geojson")
    assert (by_url["urban_rural"] == local["urban_rural"]).all()
    assert (again["urban_rural"] == local["urban_rural"]).all()
    assert (local["urban_rural"] == "urban").sum() > 500


@pytest.mark.filterwarnings("ignore:'crs' was not provided")
def test_urban_areas_without_crs_are_refused(pr_tiles_2023q4, tmp_path):
    path = tmp_path / "ua.shp"
    gpd.GeoDataFrame(geometry=[shapely.box(-66.2, 18.3, -66.0, 18.5)]).to_file(path)
    with pytest.raises(InputDataError, match="no CRS"):
        tag_urban_rural(pr_tiles_2023q4, urban_areas=path)


def test_county_share_route_matches_the_county_of_each_centre(pr_tiles_2023q4, pr_counties, centres):
    tagged, route = tag_urban_rural(pr_tiles_2023q4, threshold=0.5)
    assert route == "census-2020-county-urban-share>=0.5"
    labels = tagged["urban_rural"].to_numpy()
    seen_inside = np.zeros(len(centres), dtype=bool)
    for geom, share in zip(pr_counties.geometry, pr_counties["urban_share"]):
        inside = shapely.contains_xy(geom, centres[:, 0], centres[:, 1])
        seen_inside |= inside
        assert (labels[inside] == ("urban" if share >= 0.5 else "rural")).all()
    # Tiles outside the 1:20M coastline were still labelled, via the nearest county.
    assert 0 < (~seen_inside).sum() < 0.05 * len(centres)
    # Maricao (0% urban) is rural, San Juan (99.99%) urban.
    maricao = pr_counties.loc[pr_counties["GEOID"] == "72093", "geometry"].iloc[0]
    assert (labels[shapely.contains_xy(maricao, centres[:, 0], centres[:, 1])] == "rural").all()
    assert set(labels) == {"urban", "rural"}


def test_nearest_county_for_an_offshore_tile():
    import pandas as pd

    # A tile 2 km off Culebra (0% urban) and one off San Juan's coast.
    from geodbk.ingest.quadkey import lonlat_to_quadkey

    qk = lonlat_to_quadkey(np.array([-65.25, -66.07]), np.array([18.36, 18.49]))
    tiles = pd.DataFrame({"quadkey": qk})
    tagged, _ = tag_urban_rural(tiles)
    assert tagged["urban_rural"].tolist() == ["rural", "urban"]


def test_threshold_moves_labels_monotonically(pr_tiles_2023q4):
    counts = [
        (tag_urban_rural(pr_tiles_2023q4, threshold=t)[0]["urban_rural"] == "urban").sum() for t in (0.0, 0.5, 0.9, 1.0)
    ]
    assert counts[0] == len(pr_tiles_2023q4)
    assert counts[0] >= counts[1] >= counts[2] >= counts[3]
    assert counts[1] > counts[3]
    with pytest.raises(InputDataError, match="threshold"):
        tag_urban_rural(pr_tiles_2023q4, threshold=50)
