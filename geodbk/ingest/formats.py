"""Input file formats by suffix, and the first bytes that each must start with.

geodbk never lets GDAL guess what a user's file is: a file is read as the format its suffix
names, and only when its first bytes are that format's (a VRT saved as ``counties.geojson``
starts with ``<``, not ``{``, and is refused before GDAL sees it). The same check tells a
good download from a 200 response with a garbage body (:mod:`geodbk.ingest.sources`).

======================================  ==============  =====================================
suffix                                  format          first bytes
======================================  ==============  =====================================
``.geojson``, ``.json``                 GeoJSON         ``{`` after optional whitespace / BOM
``.shp``                                ESRI Shapefile  file code 9994 (``00 00 27 0a``)
``.gpkg``                               GeoPackage      ``SQLite format 3\\0``
``.parquet``, ``.geoparquet``, ``.pq``  (Geo)Parquet    ``PAR1``
``.zip`` (shapefiles or GeoJSON)        zip             ``PK\\3\\4`` (``PK\\5\\6`` if empty)
======================================  ==============  =====================================
"""

from __future__ import annotations

from pathlib import Path

from geodbk.errors import InputDataError

#: Suffix (lower case) -> format name.
FORMATS: dict[str, str] = {
    ".geojson": "GeoJSON",
    ".json": "GeoJSON",
    ".shp": "ESRI Shapefile",
    ".gpkg": "GPKG",
    ".parquet": "Parquet",
    ".geoparquet": "Parquet",
    ".pq": "Parquet",
    ".zip": "zip",
}
#: Bytes read from the start of a file to recognise its format.
HEAD_BYTES = 64

_MAGIC: dict[str, tuple[bytes, ...]] = {
    "ESRI Shapefile": (b"\x00\x00\x27\x0a",),
    "GPKG": (b"SQLite format 3\x00",),
    "Parquet": (b"PAR1",),
    "zip": (b"PK\x03\x04", b"PK\x05\x06"),
}


def format_of(path: str | Path, what: str = "input") -> str:
    """The format name of ``path`` by its suffix (see :data:`FORMATS`).

    Raises:
        InputDataError: the suffix is not one of :data:`FORMATS` (a ``.vrt`` among them).
    """
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise InputDataError(
            f"{what} file {Path(path).name}: unsupported type {suffix or '(no suffix)'!r}; "
            f"geodbk reads {', '.join(sorted(FORMATS))}"
        )
    return FORMATS[suffix]


def head_matches(head: bytes, fmt: str) -> bool:
    """Whether ``head`` (a file's first bytes) starts the way a ``fmt`` file does."""
    if fmt == "GeoJSON":
        return head.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n").startswith(b"{")
    return head.startswith(_MAGIC[fmt])


def check_head(head: bytes, fmt: str, label: str) -> None:
    """Raise :class:`InputDataError` unless ``head`` starts the way a ``fmt`` file does;
    ``label`` names the file in the message."""
    if not head_matches(head, fmt):
        shown = head[:16].decode("latin-1").encode("unicode_escape").decode("ascii")
        raise InputDataError(f"cannot read {label}: it is not a {fmt} file (it starts with {shown!r})")


def read_head(path: Path) -> bytes:
    """The first :data:`HEAD_BYTES` bytes of ``path``."""
    with open(path, "rb") as file:
        return file.read(HEAD_BYTES)


__all__ = ["FORMATS", "HEAD_BYTES", "check_head", "format_of", "head_matches", "read_head"]
