"""Disguised vector files (issue 35, class 1): no file makes geodbk reach a URL or read a path it
was not given, and a refusal quotes none of a file's bytes.

Every file here is one that GDAL, handed it directly, follows: ``{}`` or ``{`` and spaces before
an OGR VRT whose ``SrcDataSource`` is a ``/vsicurl/``, ``/vsicurl_streaming/`` or ``http://`` URL or
a local CSV, a WFS capabilities document after ``{}``, VRTs as zip members, GeoJSON ``crs`` links
(top level, ``url`` type, a name GDAL reads as ``crs`` though spelt otherwise, after 2 MB of
features, in a zip member); and a GeoPackage of two layers (GDAL reads the first, with a warning)
and a ``.geojson`` link to ``/etc/passwd`` (whose first bytes a refusal used to quote).

Each must end in a one-line refusal through :func:`geodbk.ingest.vectorfiles.read_vector` and
through ``geodbk ingest --region`` and ``--tiles`` (the ``hostile`` harness, tests/hostile/conftest.py),
while a loopback HTTP server that the links point at, started here, sees no connection at all and
the CSV's text appears in no output. The server answers every request with a polygon over Puerto
Rico, so a followed link is used: before the door, most of these commands exited 0.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import geopandas as gpd
import pandas as pd
import pyogrio
import pytest
import shapely

from geodbk.errors import InputDataError
from geodbk.ingest.vectorfiles import NETWORK_OFF, gdal_network_off, read_vector, read_vector_layers

#: Raw Ookla columns written to the tile file.
RAW = ["quadkey", "year", "quarter", "service", "avg_d_kbps", "avg_u_kbps", "avg_lat_ms", "tests", "devices"]
#: The text of the local CSV a VRT names: it must appear in no output.
SECRET = "TOPSECRET-4b1d"
#: A box over Puerto Rico, the polygon the trap serves and the CSV holds.
PR_BOX = shapely.box(-67.3, 17.9, -65.2, 18.6)


class _Trap(http.server.BaseHTTPRequestHandler):
    """Records every connection and answers any request with :data:`PR_BOX` as GeoJSON (a PROJ
    string for ``*.prj``), so that a link GDAL follows is used."""

    connections: list[str]

    def handle(self) -> None:
        self.connections.append(f"{self.client_address}")
        super().handle()

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.connections.append(f"{self.command} {self.path}")
        if self.path.endswith(".prj"):
            body = b"+proj=longlat +datum=WGS84 +no_defs"
        else:
            body = gpd.GeoDataFrame({"name": ["PR"]}, geometry=[PR_BOX], crs=4326).to_json().encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_HEAD = do_POST = do_GET  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


class _TrapServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that hangs up mid-answer


@pytest.fixture(scope="module")
def trap() -> Iterator[tuple[str, list[str]]]:
    """``(base_url, connections)`` of an HTTP server on a free 127.0.0.1 port, on a thread."""
    connections: list[str] = []
    server = _TrapServer(("127.0.0.1", 0), type("Handler", (_Trap,), {"connections": connections}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", connections
    server.shutdown()
    server.server_close()


def _vrt(source: str, lead: str = "{}\n", layer: str = "prpoly") -> bytes:
    return (f'{lead}<OGRVRTDataSource><OGRVRTLayer name="{layer}"><SrcDataSource>{source}</SrcDataSource>'
            "<LayerSRS>EPSG:4326</LayerSRS></OGRVRTLayer></OGRVRTDataSource>\n").encode()


def _geojson(crs_name: str, crs: dict, features: int = 1) -> bytes:
    feature = {"type": "Feature", "properties": {"pad": "x" * 200}, "geometry": shapely.geometry.mapping(PR_BOX)}
    text = json.dumps({"type": "FeatureCollection", "features": [feature] * features, "crs": crs})
    return text.replace('"crs":', f'"{crs_name}":').encode()


def _link(base: str, name: str, kind: str = "link") -> dict:
    key = "url" if kind == "url" else "href"
    return {"type": kind, "properties": {key: f"{base}/{name}.prj", "type": "proj4"}}


def _zip(path: Path, name: str, data: bytes) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(name, data)


#: case -> (file name, its bytes from (base_url, root)); a zip holds them as ``r.geojson``.
DISGUISES: dict[str, tuple[str, Callable[[str, Path], bytes]]] = {
    "VRT after {} (the issue's)": ("r.geojson", lambda b, r: _vrt(f"/vsicurl/{b}/prpoly.geojson")),
    "VRT after { and 900 spaces": ("r900.json", lambda b, r: _vrt(f"/vsicurl/{b}/p.geojson", "{" + " " * 900)),
    "VRT of /vsicurl_streaming/": ("rs.geojson", lambda b, r: _vrt(f"/vsicurl_streaming/{b}/s.geojson")),
    "VRT of an http URL": ("rh.geojson", lambda b, r: _vrt(f"{b}/h.geojson")),
    "VRT of a local CSV": ("rc.geojson", lambda b, r: _vrt(str(r / "secret.csv"), layer="secret")),
    "WFS capabilities after {}": ("wfs.geojson", lambda b, r: (
        '{}\n<WFS_Capabilities version="1.1.0"><OperationsMetadata><Operation name="GetFeature"><DCP><HTTP>'
        f'<Get href="{b}/wfs?"/></HTTP></DCP></Operation></OperationsMetadata><FeatureTypeList><FeatureType>'
        "<Name>a</Name></FeatureType></FeatureTypeList></WFS_Capabilities>\n").encode()),
    "VRT in a zip member": ("vz.zip", lambda b, r: _vrt(f"/vsicurl/{b}/z.geojson")),
    "VRT of a local CSV in a zip member": ("vcz.zip", lambda b, r: _vrt(str(r / "secret.csv"), layer="secret")),
    "crs link (the issue's)": ("link.geojson", lambda b, r: _geojson("crs", _link(b, "crs"))),
    "crs of type url": ("url.geojson", lambda b, r: _geojson("crs", _link(b, "url", "url"))),
    "crs link named CR\\u0053\\u0000x": ("esc.geojson", lambda b, r: _geojson("CR\\u0053\\u0000x", _link(b, "e"))),
    "crs link after 2 MB of features": ("late.geojson", lambda b, r: _geojson("crs", _link(b, "late"), 8000)),
    "crs link in a zip member": ("cz.zip", lambda b, r: _geojson("crs", _link(b, "zip"))),
}
#: Cases whose refusal is of the region only (as tiles, every layer is asked for).
TWO_LAYERS, PASSWD = "GeoPackage of two layers", "a .geojson link to /etc/passwd"
CASES = [*DISGUISES, TWO_LAYERS, PASSWD]


@pytest.fixture(scope="module")
def root(tmp_path_factory, pr_tiles_2023q4, trap) -> Path:
    """A small tile file, the CSV a VRT names, and one file per case (see :data:`CASES`)."""
    base, _ = trap
    root = tmp_path_factory.mktemp("vector-door")
    pd.DataFrame(pr_tiles_2023q4[RAW].iloc[::20]).reset_index(drop=True).to_parquet(root / "tiles.parquet")
    (root / "secret.csv").write_text(f'WKT,name\n"{PR_BOX.wkt}",{SECRET}\n')
    for name, make in DISGUISES.values():
        data = make(base, root)
        if name.endswith(".zip"):
            _zip(root / name, "r.geojson", data)
        else:
            (root / name).write_bytes(data)
    halves = {"north": shapely.box(-67.3, 18.25, -65.2, 18.6), "south": shapely.box(-67.3, 17.9, -65.2, 18.25)}
    for layer, polygon in halves.items():
        gpd.GeoDataFrame({"name": [layer]}, geometry=[polygon], crs=4326).to_file(
            root / "two.gpkg", layer=layer, engine="pyogrio")
    (root / "passwd.geojson").symlink_to("/etc/passwd")
    (root / "out").mkdir()
    return root


def _path(root: Path, case: str) -> Path:
    if case == TWO_LAYERS:
        return root / "two.gpkg"
    if case == PASSWD:
        return root / "passwd.geojson"
    return root / DISGUISES[case][0]


def _phrase(case: str) -> str:
    """What the refusal of ``case`` says."""
    if case == TWO_LAYERS:
        return "holds 2 layers ('north', 'south')"
    if case == PASSWD:
        return "not a GeoJSON file (it starts with text)"
    return '"crs" member' if "crs" in case else "GDAL <"


def _leaks(text: str, base: str) -> list[str]:
    """What of the files' bytes ``text`` shows: the CSV's text, the trap's address, /etc/passwd's head."""
    passwd = Path("/etc/passwd").read_bytes()[:8].decode("latin-1")
    return [leak for leak in (SECRET, base.removeprefix("http://"), passwd) if leak and leak in text]


@pytest.fixture
def run(hostile, capsys, monkeypatch) -> Callable[[list, Path], tuple[list[str], str]]:
    """``run(argv, root)``: the ``hostile`` case, refused; its stderr lines and all it printed."""
    printed: list[str] = []
    readouterr = capsys.readouterr

    def recording():  # the harness reads stdout and stderr once after the command
        captured = readouterr()
        printed.append(captured.out + captured.err)
        return captured

    monkeypatch.setattr(capsys, "readouterr", recording)

    def run_case(argv: list, root: Path) -> tuple[list[str], str]:
        printed.clear()
        outcome = hostile(argv, root, expect="refused")
        return outcome.stderr, "".join(printed)

    return run_case


@pytest.mark.parametrize("case", CASES)
def test_read_vector_refuses_in_one_line_without_a_request(root, trap, case):
    base, connections = trap
    before = len(connections)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no library warning either
        with pytest.raises(InputDataError) as refusal:
            read_vector(_path(root, case), "region")
    message = str(refusal.value)
    assert _phrase(case) in message and "\n" not in message and not _leaks(message, base), message
    assert connections[before:] == []


@pytest.mark.parametrize("option", ["--region", "--tiles"])
@pytest.mark.parametrize("case", CASES)
def test_ingest_refuses_in_one_line_without_a_request(run, root, trap, case, option):
    if option == "--tiles" and case == TWO_LAYERS:
        pytest.skip("as tiles, every layer of a GeoPackage is read")
    base, connections = trap
    before = len(connections)
    out = root / "out" / "out.parquet"
    inputs = {"--tiles": root / "tiles.parquet", "--region": "PR", option: _path(root, case)}
    stderr, printed = run(["ingest", "--tiles", inputs["--tiles"], "--region", inputs["--region"], "--out", out], root)
    assert _phrase(case) in stderr[-1] and not _leaks(printed, base), printed
    assert not any("warning" in line.lower() for line in stderr), stderr
    assert connections[before:] == []
    assert not out.exists()


def test_two_layers_are_named_or_all_read(root, trap):
    with pytest.raises(InputDataError, match="2 layers.*'north'.*'south'"):
        read_vector(root / "two.gpkg", "region")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layers = read_vector_layers(root / "two.gpkg", "region")
    assert [(Path(name).name, frame["name"].tolist()) for name, frame in layers] == [
        ("north", ["north"]), ("south", ["south"])]


def test_gdal_stays_off_the_network_even_when_handed_the_files(root, trap, monkeypatch):
    """The second wall: GDAL given the VRT and crs-link files directly, inside
    :func:`gdal_network_off`, reaches no server, also with ``NO_PROXY`` naming every host."""
    base, connections = trap
    monkeypatch.setenv("NO_PROXY", "*")
    monkeypatch.setenv("no_proxy", "*")
    before = {name: pyogrio.get_gdal_config_option(name) for name in NETWORK_OFF}
    count = len(connections)
    for case in ("VRT after {} (the issue's)", "VRT of an http URL", "WFS capabilities after {}",
                 "crs link (the issue's)", "crs of type url"):
        with gdal_network_off():
            try:
                gpd.read_file(_path(root, case), engine="pyogrio")
            except Exception:  # the VRT's source does not open: what is wanted
                pass
    assert connections[count:] == []
    assert {name: pyogrio.get_gdal_config_option(name) for name in NETWORK_OFF} == before
    assert os.environ["NO_PROXY"] == os.environ["no_proxy"] == "*"


def test_plain_files_are_still_read(tmp_path):
    """What the checks must let through, without a warning: a GDAL-written GeoJSON in EPSG:3857
    (its crs a name), properties named ``crs`` or holding HTML, and a GeoPackage of one polygon
    layer beside a table without geometries."""
    pr = gpd.GeoDataFrame({"crs": ["EPSG:3857"], "note": ["<b>OGRVRT</b> <a href='http://x/'>x</a>"]},
                          geometry=[PR_BOX], crs=4326)
    pr.to_crs(3857).to_file(tmp_path / "mercator.geojson", driver="GeoJSON", engine="pyogrio")
    pr.to_file(tmp_path / "mixed.gpkg", layer="pr", engine="pyogrio")
    pyogrio.write_dataframe(pd.DataFrame({"x": [1]}), tmp_path / "mixed.gpkg", layer="table")
    assert b'"crs": { "type": "name"' in (tmp_path / "mercator.geojson").read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("mercator.geojson", "mixed.gpkg"):
            frame = read_vector(tmp_path / name, "region")
            assert frame.to_crs(4326).geometry.iloc[0].equals_exact(PR_BOX, 1e-6)
            assert frame["note"].iloc[0] == pr["note"].iloc[0]
