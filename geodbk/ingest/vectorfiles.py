"""Read a user's vector file so that nothing in it can steer the reader.

``gpd.read_file`` lets GDAL choose the driver from a file's content and resolve any path or
URL that the content names: ``{}`` followed by an OGR VRT, saved as ``counties.geojson``, is
opened as a VRT that downloads a URL or reads a local CSV, and a GeoJSON ``crs`` member of type
``link`` makes GDAL fetch its ``href``. Every user path geodbk reads as vectors
(``ingest --tiles/--region/--urban-areas``, ``fit --density-tiles``, ``summarize --polygons``,
``serve --polygons``) goes through :func:`read_vector_layers` or :func:`read_vector` instead,
which

* takes the format from the suffix, from an allow-list (:data:`geodbk.ingest.formats.FORMATS`:
  GeoJSON, shapefile, zipped shapefiles or GeoJSON files, GeoPackage, (Geo)Parquet); a
  ``.vrt`` or any other suffix is refused;
* refuses GDAL virtual paths (``/vsicurl/``, ``/vsizip/``, ...) as inputs;
* reads the first bytes of the file, or of each zip member, and refuses one that does not
  start the way its format does, or that holds a tag of a GDAL VRT or web-service
  description anywhere in them (:func:`geodbk.ingest.formats.check_head`), before GDAL
  opens it; a refusal describes those bytes and never quotes them;
* reads every GeoJSON through, and refuses one with a ``crs`` member that is not a CRS name
  (:func:`check_geojson_crs`);
* reads one layer: a GeoPackage of several layers, or a zip of several shapefiles, is refused
  in one line that names them, unless the caller asks for all (:func:`read_vector_layers`);
* hands GDAL an absolute path (so no ``DRIVER:`` prefix is read from it) and builds the
  ``/vsizip/`` path of a zip member itself (so a ``!`` in the zip's name is just a character);
* keeps GDAL off the network while it reads (:func:`gdal_network_off`): should a file get past
  the checks above, GDAL can still read no URL (downloads happen only in
  :mod:`geodbk.ingest.sources`, with its limits);
* reads (Geo)Parquet with pyarrow, without GDAL.

Zips are never extracted: members are read in place. A file can still make GDAL read its own
sidecars (a shapefile's ``.dbf``, ``.shx``, ``.prj`` and ``.cpg``, in its folder or zip) and
nothing else.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import threading
import zipfile
import zlib
from collections.abc import Generator, Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

import geopandas as gpd
import pyogrio

from geodbk.errors import InputDataError
from geodbk.ingest.formats import HEAD_BYTES, check_head, format_of

#: Suffixes of the zip members that are read: shapefiles first, else GeoJSON files.
ZIP_LAYER_SUFFIXES = ((".shp",), (".geojson", ".json"))
#: Bytes read at a time from a file or zip member (at least :data:`HEAD_BYTES`).
CHUNK_BYTES = 1 << 20
#: Most members a zip may hold (a shapefile is 3 to 8 of them): each layer member is checked and
#: read on its own, and a 300 KB zip of 3,000 empty GeoJSON files took 34 s to refuse.
MAX_ZIP_MEMBERS = 256

#: GDAL configuration while it reads a user's file. No ``/vsicurl/``-family path (``/vsis3/``,
#: ``/vsiwebhdfs/``, ...) is taken to exist, because the one allowed file name is empty; every
#: other HTTP request (``CPLHTTPFetch``: a GeoJSON ``crs`` link, an ``http://`` data source, WFS)
#: goes through a proxy URL that curl rejects before it connects.
NETWORK_OFF = {
    "CPL_VSIL_CURL_ALLOWED_FILENAME": "",
    "GDAL_HTTP_PROXY": "geodbk-network-off://",
    "GDAL_HTTPS_PROXY": "geodbk-network-off://",
}
#: Environment variables that make curl skip the proxy for the hosts they list: hidden while
#: GDAL reads, so that :data:`NETWORK_OFF` holds for every host.
_NO_PROXY_VARIABLES = ("no_proxy", "NO_PROXY")
#: GDAL's configuration is global to the process: one thread at a time sets and restores it (a
#: block inside another restores what the outer one set).
_GDAL_LOCK = threading.RLock()

#: A member name that GDAL's JSON parser reads as ``crs``: any case, letters maybe ``\u``-escaped,
#: and anything after a ``\u0000`` (its names end at the first NUL).
_CRS_NAME = re.compile(rb'"(?:c|\\u00[46]3)(?:r|\\u00[57]2)(?:s|\\u00[57]3)(?="|\\u0000)', re.IGNORECASE)
#: Bytes after a ``crs`` name within which its value must end.
_CRS_WINDOW = 64 * 1024
#: Bytes kept from one chunk to the next, so that a name split between them is found.
_CRS_OVERLAP = 32
#: CRS names that are URLs GDAL resolves without the network.
_OGC_CRS_URLS = ("http://www.opengis.net/def/crs/", "https://www.opengis.net/def/crs/")


@contextmanager
def gdal_network_off() -> Iterator[None]:
    """GDAL (pyogrio's) without the network inside the block (:data:`NETWORK_OFF`); its
    configuration and the ``no_proxy`` variables are restored after. One thread at a time."""
    with _GDAL_LOCK:
        saved = {name: pyogrio.get_gdal_config_option(name) for name in NETWORK_OFF}
        hidden = {name: os.environ.pop(name) for name in _NO_PROXY_VARIABLES if name in os.environ}
        try:
            pyogrio.set_gdal_config_options(NETWORK_OFF)
            yield
        finally:
            pyogrio.set_gdal_config_options(saved)
            os.environ.update(hidden)


class _Members(list[tuple[str, object]]):
    """A JSON object as the ``(name, value)`` pairs of its members, in order, repeats kept."""


def _values(members: _Members, name: str) -> list[object]:
    """The values of the members that GDAL finds by ``name``: any case, up to a NUL."""
    return [value for key, value in members if key.split("\0", 1)[0].casefold() == name]


def _names_a_crs(value: object) -> bool:
    """Whether the value of a ``crs`` member leaves GDAL nothing to fetch or open: not an
    object (GDAL reads only an object as a CRS; a property named ``crs`` is data), or of type
    ``name`` or ``EPSG`` and no name with a ``/`` or ``\\`` in it but an ``opengis.net`` CRS URL."""
    if not isinstance(value, _Members):
        return True
    kinds = [kind.split("\0", 1)[0].casefold() if isinstance(kind, str) else kind for kind in _values(value, "type")]
    if not kinds or any(kind not in ("name", "epsg") for kind in kinds):
        return False
    properties = [p for p in _values(value, "properties") if isinstance(p, _Members)]
    names = [name for p in properties for name in _values(p, "name")]
    return all(
        isinstance(name, str) and (name.startswith(_OGC_CRS_URLS) or not re.search(r"[/\\]", name)) for name in names
    )


def _crs_member_ok(window: bytes) -> bool:
    """Whether the ``crs`` name at the start of ``window`` is no member, or one whose value
    ends in ``window`` and :func:`_names_a_crs`."""
    text = window.decode("utf-8", errors="replace")
    decoder = json.JSONDecoder(strict=False, object_pairs_hook=_Members)
    try:
        _, end = decoder.raw_decode(text)  # the name
        start = len(text) - len(text[end:].lstrip(" \t\r\n"))
        if text[start : start + 1] != ":":
            return True  # a string that is no member name
        value, _ = decoder.raw_decode(text, len(text) - len(text[start + 1 :].lstrip(" \t\r\n")))
    except ValueError:
        return False
    return _names_a_crs(value)


def check_geojson_crs(chunks: Iterable[bytes], label: str) -> None:
    """Refuse a GeoJSON, given as consecutive chunks of bytes, with a ``crs`` member (at any
    depth) that is not a CRS name (:func:`_names_a_crs`).

    GDAL fetches the ``href`` of a ``crs`` of type ``link`` or ``url``. Such a member is refused,
    not dropped: without it GDAL would read the coordinates as EPSG:4326, which the file says
    they are not. A member whose value geodbk cannot parse within 64 KiB is refused too.

    Raises:
        InputDataError: such a member, in one line; ``label`` names the file.
    """
    buffer = b""
    stream = iter(chunks)
    more = True
    while more:
        chunk = next(stream, b"")
        more = bool(chunk)
        buffer += chunk
        keep = max(0, len(buffer) - _CRS_OVERLAP)
        for match in _CRS_NAME.finditer(buffer):
            if more and len(buffer) - match.start() < _CRS_WINDOW:
                keep = match.start()  # its value may go on in the next chunk
                break
            if not _crs_member_ok(buffer[match.start() : match.start() + _CRS_WINDOW]):
                raise InputDataError(
                    f'cannot read {label}: its "crs" member is not a CRS name but a link, URL or path that GDAL '
                    "would fetch or open; name the CRS (e.g. EPSG:4326), or reproject to EPSG:4326 and drop it"
                )
        buffer = buffer[keep:]


def checked_path(path: str | Path, what: str) -> Path:
    """``path`` as an existing local file of an allowed format, or a one-line refusal.

    Raises:
        InputDataError: a GDAL virtual path (``/vsi...``), an unsupported suffix, or no file.
    """
    text = str(path)
    if text.lower().startswith("/vsi"):
        raise InputDataError(f"{what} file {text}: GDAL virtual paths (/vsi...) are not read; give a local file")
    path = Path(path)
    format_of(path, what)
    if not path.is_file():
        raise InputDataError(f"{what} file not found: {path}")
    return path


def _open_zip(path: Path) -> zipfile.ZipFile:
    """Zip file ``path``, open for reading.

    Raises:
        InputDataError: not a readable zip.
    """
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        raise InputDataError(f"cannot read zip file {path}: {err}") from err


def zip_layers(path: Path, what: str) -> list[str]:
    """The members of zip ``path`` that hold layers: its shapefiles, else its GeoJSON files.

    Raises:
        InputDataError: not a readable zip, more than :data:`MAX_ZIP_MEMBERS` members, or it
            holds neither.
    """
    with _open_zip(path) as archive:
        names = archive.namelist()
    if len(names) > MAX_ZIP_MEMBERS:
        raise InputDataError(
            f"{what} zip file {path} holds {len(names):,} members, more than the {MAX_ZIP_MEMBERS} geodbk reads; "
            "give a zip of one shapefile or a few GeoJSON files"
        )
    for suffixes in ZIP_LAYER_SUFFIXES:
        members = sorted(n for n in names if n.lower().endswith(suffixes) and not n.startswith("__MACOSX/"))
        if members:
            return members
    raise InputDataError(f"{what} zip file {path} holds neither a shapefile nor GeoJSON files")


def _file_chunks(path: Path, label: str) -> Iterator[bytes]:
    """The bytes of ``path``, :data:`CHUNK_BYTES` at a time."""
    try:
        with open(path, "rb") as file:
            while chunk := file.read(CHUNK_BYTES):
                yield chunk
    except OSError as err:
        raise InputDataError(f"cannot read {label}: {err.strerror or err}") from err


def _member_chunks(archive: zipfile.ZipFile, path: Path, member: str) -> Generator[bytes, None, None]:
    """The bytes of member ``member`` of ``archive`` (zip file ``path``), :data:`CHUNK_BYTES` at a time."""
    try:
        with archive.open(member) as file:
            while chunk := file.read(CHUNK_BYTES):
                yield chunk
    except (zipfile.BadZipFile, OSError, ValueError, RuntimeError, EOFError, zlib.error) as err:
        raise InputDataError(f"cannot read {member} in zip file {path}: {err}") from err  # RuntimeError: encrypted


def _check_content(chunks: Iterator[bytes], fmt: str, label: str) -> None:
    """Refuse content that is not ``fmt``'s or that could steer GDAL: the head check, and for a
    GeoJSON the ``crs`` check over all of it."""
    first = next(chunks, b"")
    check_head(first[:HEAD_BYTES], fmt, label)
    if fmt == "GeoJSON":
        check_geojson_crs(itertools.chain([first], chunks), label)


@dataclass(frozen=True)
class _Layer:
    """One layer to read: ``name`` for the caller (the file, ``<zip>/<member>`` or
    ``<gpkg>/<layer>``), what GDAL opens (``uri`` and ``layer``), and ``label`` for messages."""

    name: str
    uri: str
    fmt: str
    label: str
    layer: str | None = None


def _gpkg_layers(uri: str, label: str) -> list[str]:
    """The names of the layers with geometries of GeoPackage ``uri``.

    Raises:
        InputDataError: unreadable, or no such layer.
    """
    try:
        with gdal_network_off():
            listed = pyogrio.list_layers(uri)
    except Exception as err:  # pyogrio raises several error types for unreadable files
        raise InputDataError(f"cannot read {label}: {' '.join(str(err).split())}") from err
    names = [str(name) for name, geometry in listed if geometry is not None]
    if not names:
        raise InputDataError(f"{label} holds no layer with geometries")
    return names


def _zip_member_layers(path: Path, what: str, label: str) -> list[_Layer]:
    """The layers of zip ``path`` (:func:`zip_layers`), each member's content checked by
    :func:`_check_content`, the zip opened once for them all.

    Raises:
        InputDataError: as :func:`zip_layers`, or a member refused.
    """
    layers = []
    members = zip_layers(path, what)
    with _open_zip(path) as archive:
        for member in members:
            member_fmt, member_label = format_of(member, what), f"{member} in {label}"
            with closing(_member_chunks(archive, path, member)) as chunks:
                _check_content(chunks, member_fmt, member_label)
            layers.append(_Layer(f"{path}/{member}", f"/vsizip/{path.resolve()}/{member}", member_fmt, member_label))
    return layers


def _layers(path: str | Path, what: str) -> list[_Layer]:
    """The layers of ``path``, checked (see the module docstring) but not read."""
    path = checked_path(path, what)
    fmt = format_of(path, what)
    label = f"{what} file {path}"
    _check_content(_file_chunks(path, label), fmt, label)
    if fmt != "zip":
        uri = str(path.resolve())
        if fmt != "GPKG":
            return [_Layer(str(path), uri, fmt, label)]
        names = _gpkg_layers(uri, label)
        if len(names) == 1:
            return [_Layer(str(path), uri, fmt, label, names[0])]
        return [_Layer(f"{path}/{name}", uri, fmt, f"layer {name!r} of {label}", name) for name in names]
    return _zip_member_layers(path, what, label)


def _read(layer: _Layer) -> gpd.GeoDataFrame:
    """Read one checked layer: Parquet with pyarrow, the rest with GDAL off the network."""
    try:
        if layer.fmt == "Parquet":
            return gpd.read_parquet(layer.uri)
        with gdal_network_off():
            return gpd.read_file(layer.uri, engine="pyogrio", layer=layer.layer)
    except Exception as err:  # pyarrow, pyogrio and geopandas raise several types for bad files
        raise InputDataError(f"cannot read {layer.label}: {' '.join(str(err).split())}") from err


def read_vector_layers(path: str | Path, what: str) -> list[tuple[str, gpd.GeoDataFrame]]:
    """Every layer of the vector file ``path``: ``[(name, frame)]``, one for a plain file,
    one per shapefile or GeoJSON member of a zip (``name`` is ``<zip>/<member>``) and one per
    layer with geometries of a GeoPackage (``<gpkg>/<layer>`` when it has several).

    Args:
        path: local path (URLs are fetched first, see :mod:`geodbk.ingest.sources`).
        what: what the file is (``"region"``, ``"tile"``), for messages.

    Raises:
        InputDataError: refused (see the module docstring), unreadable, or corrupt.
    """
    return [(layer.name, _read(layer)) for layer in _layers(path, what)]


def read_vector(path: str | Path, what: str) -> gpd.GeoDataFrame:
    """The one layer of the vector file ``path`` (see :func:`read_vector_layers`).

    Raises:
        InputDataError: as :func:`read_vector_layers`, or a zip or GeoPackage of several
            layers (named in the message), before any is read.
    """
    layers = _layers(path, what)
    if len(layers) != 1:
        shown = [Path(layer.name).name if layer.layer is None else layer.layer for layer in layers[:5]]
        names = ", ".join(repr(name if len(name) <= 60 else name[:57] + "...") for name in shown)
        more = ", ..." if len(layers) > len(shown) else ""
        raise InputDataError(
            f"{what} file {path} holds {len(layers)} layers ({names}{more}); give a file with one layer"
        )
    return _read(layers[0])


__all__ = [
    "CHUNK_BYTES",
    "MAX_ZIP_MEMBERS",
    "NETWORK_OFF",
    "ZIP_LAYER_SUFFIXES",
    "check_geojson_crs",
    "checked_path",
    "gdal_network_off",
    "read_vector",
    "read_vector_layers",
    "zip_layers",
]
