"""Read a user's vector file so that nothing in it can steer the reader.

``gpd.read_file`` lets GDAL choose the driver from a file's content and resolve any path it
is given, so a VRT saved as ``counties.geojson`` makes GDAL open the URLs or local files the
VRT names, and a ``/vsicurl/`` path is a download. Every user path geodbk reads as vectors
(``ingest --tiles/--region/--urban-areas``, ``summarize --polygons``, ``serve --polygons``)
goes through :func:`read_vector_layers` instead, which

* takes the format from the suffix, from an allow-list (:data:`geodbk.ingest.formats.FORMATS`:
  GeoJSON, shapefile, zipped shapefiles or GeoJSON files, GeoPackage, (Geo)Parquet); a
  ``.vrt`` or any other suffix is refused;
* refuses GDAL virtual paths (``/vsicurl/``, ``/vsizip/``, ...) as inputs;
* reads the first bytes of the file, or of each zip member, and refuses one that does not
  start the way its format does, before GDAL opens it;
* hands GDAL an absolute path (so no ``DRIVER:`` prefix is read from it) and builds the
  ``/vsizip/`` path of a zip member itself (so a ``!`` in the zip's name is just a character);
* reads (Geo)Parquet with pyarrow, without GDAL.

Zips are never extracted: members are read in place.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import geopandas as gpd

from geodbk.errors import InputDataError
from geodbk.ingest.formats import HEAD_BYTES, check_head, format_of, read_head

#: Suffixes of the zip members that are read: shapefiles first, else GeoJSON files.
ZIP_LAYER_SUFFIXES = ((".shp",), (".geojson", ".json"))


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


def zip_layers(path: Path, what: str) -> list[str]:
    """The members of zip ``path`` that hold layers: its shapefiles, else its GeoJSON files.

    Raises:
        InputDataError: not a readable zip, or it holds neither.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        raise InputDataError(f"cannot read zip file {path}: {err}") from err
    for suffixes in ZIP_LAYER_SUFFIXES:
        members = sorted(n for n in names if n.lower().endswith(suffixes) and not n.startswith("__MACOSX/"))
        if members:
            return members
    raise InputDataError(f"{what} zip file {path} holds neither a shapefile nor GeoJSON files")


def _member_head(path: Path, member: str) -> bytes:
    try:
        with zipfile.ZipFile(path) as archive, archive.open(member) as file:
            return file.read(HEAD_BYTES)
    except (zipfile.BadZipFile, OSError, ValueError, RuntimeError) as err:  # RuntimeError: encrypted member
        raise InputDataError(f"cannot read {member} in zip file {path}: {err}") from err


def _gdal_read(uri: str, label: str) -> gpd.GeoDataFrame:
    try:
        return gpd.read_file(uri, engine="pyogrio")
    except Exception as err:  # pyogrio raises several error types for unreadable files
        raise InputDataError(f"cannot read {label}: {' '.join(str(err).split())}") from err


def read_vector_layers(path: str | Path, what: str) -> list[tuple[str, gpd.GeoDataFrame]]:
    """Every layer of the vector file ``path``: ``[(name, frame)]``, one for a plain file and
    one per shapefile or GeoJSON member of a zip (``name`` is ``<zip>/<member>``).

    Args:
        path: local path (URLs are fetched first, see :mod:`geodbk.ingest.sources`).
        what: what the file is (``"region"``, ``"tile"``), for messages.

    Raises:
        InputDataError: refused (see the module docstring), unreadable, or corrupt.
    """
    path = checked_path(path, what)
    fmt = format_of(path, what)
    label = f"{what} file {path}"
    check_head(read_head(path), fmt, label)
    if fmt == "Parquet":
        try:
            return [(str(path), gpd.read_parquet(path))]
        except Exception as err:  # pyarrow and geopandas raise several types for bad files
            raise InputDataError(f"cannot read {label}: {' '.join(str(err).split())}") from err
    if fmt != "zip":
        return [(str(path), _gdal_read(str(path.resolve()), label))]
    layers = []
    for member in zip_layers(path, what):
        member_label = f"{member} in {label}"
        check_head(_member_head(path, member), format_of(member, what), member_label)
        layers.append((f"{path}/{member}", _gdal_read(f"/vsizip/{path.resolve()}/{member}", member_label)))
    return layers


def read_vector(path: str | Path, what: str) -> gpd.GeoDataFrame:
    """The one layer of the vector file ``path`` (see :func:`read_vector_layers`).

    Raises:
        InputDataError: as :func:`read_vector_layers`, or a zip with several layers.
    """
    layers = read_vector_layers(path, what)
    if len(layers) != 1:
        names = ", ".join(Path(name).name for name, _ in layers[:3])
        raise InputDataError(f"{what} zip file {path} holds {len(layers)} layers ({names}, ...); give one file")
    return layers[0][1]


__all__ = ["checked_path", "read_vector", "read_vector_layers", "zip_layers"]
