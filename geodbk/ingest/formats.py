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

Starting right is not enough for the formats GDAL reads: its VRT driver claims any file whose
first kilobyte *contains* ``<OGRVRTDataSource``, and its WFS driver any whose first few
kilobytes contain ``<WFS_Capabilities``, so ``{}`` followed by a VRT is opened as a VRT that
fetches a URL or reads a local file. :func:`check_head` also refuses a head of a GeoJSON,
shapefile or GeoPackage that holds, anywhere and in any case, a tag of a GDAL description
that names other sources (:data:`SOURCE_TAGS`).

A refusal says what the file looks like (an HTML page, a zip file, text, ...), never its
bytes: the file may be a link to one the user did not mean to show, such as ``/etc/passwd``.
"""

from __future__ import annotations

import codecs
import re
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
#: Bytes read from the start of a file to recognise its format and look for :data:`SOURCE_TAGS`:
#: ten times what GDAL 3.12's drivers sniff (1,024 bytes for VRT, about 6,000 for WFS).
HEAD_BYTES = 64 * 1024
#: The formats that GDAL reads, whose heads must not hold a :data:`SOURCE_TAGS` tag.
GDAL_FORMATS = frozenset({"GeoJSON", "ESRI Shapefile", "GPKG"})
#: Root tags of the GDAL descriptions (VRT, WFS, WMS, WMTS, tile index) that make GDAL open
#: the files or URLs they name.
SOURCE_TAGS = (
    "OGRVRTDataSource",
    "VRTDataset",
    "GDALTileIndexDataset",
    "OGRWFSDataSource",
    "WFS_Capabilities",
    "WMS_Capabilities",
    "WMT_MS_Capabilities",
    "GDAL_WMS",
    "GDAL_WMTS",
)
_SOURCE_TAG = re.compile(
    rb"<\s*(?:[\w.-]+:)?(" + b"|".join(re.escape(t.encode()) for t in SOURCE_TAGS) + rb")", re.IGNORECASE
)

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


def source_tag(head: bytes) -> str | None:
    """The first of :data:`SOURCE_TAGS` that ``head`` holds as a tag (any case, any namespace),
    spelt as in the list, or ``None``."""
    match = _SOURCE_TAG.search(head)
    if match is None:
        return None
    found = match.group(1).decode("ascii").casefold()
    return next(tag for tag in SOURCE_TAGS if tag.casefold() == found)


#: First bytes -> what a file that starts with them looks like, for :func:`describe_head`.
_LOOKS: tuple[tuple[bytes, str], ...] = (
    (b"PK\x03\x04", "a zip file"),
    (b"PK\x05\x06", "an empty zip file"),
    (b"PAR1", "a Parquet file"),
    (b"SQLite format 3\x00", "an SQLite database"),
    (b"\x00\x00\x27\x0a", "a shapefile"),
    (b"\x1f\x8b", "gzip data"),
)


def describe_head(head: bytes) -> str:
    """What a file whose first bytes are ``head`` looks like, in words that quote none of them
    (``"it starts like an HTML page"``, ``"it starts with text"``, ...)."""
    if not head:
        return "it is empty"
    for magic, looks in _LOOKS:
        if head.startswith(magic):
            return f"it starts like {looks}"
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    if re.match(rb"<(?:!doctype\s+html|html)\b", text, re.IGNORECASE):
        return "it starts like an HTML page"
    if text.startswith(b"<"):
        return "it starts like XML"
    if text.startswith((b"{", b"[")):
        return "it starts like JSON"
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head)  # a character cut at the end is no error
    except UnicodeDecodeError:
        return "it starts with binary data"
    return "it starts with binary data" if b"\x00" in head else "it starts with text"


def check_head(head: bytes, fmt: str, label: str) -> None:
    """Raise :class:`InputDataError` unless ``head`` starts the way a ``fmt`` file does and, for
    a format GDAL reads, holds no :data:`SOURCE_TAGS` tag; ``label`` names the file in the
    message, which describes the head without quoting it (:func:`describe_head`)."""
    if not head_matches(head, fmt):
        raise InputDataError(f"cannot read {label}: it is not a {fmt} file ({describe_head(head)})")
    tag = source_tag(head) if fmt in GDAL_FORMATS else None
    if tag is not None:
        raise InputDataError(
            f"cannot read {label}: it is not a {fmt} file (it holds a GDAL <{tag}> tag, "
            "which would make GDAL open the files or URLs it names)"
        )


def read_head(path: Path) -> bytes:
    """The first :data:`HEAD_BYTES` bytes of ``path``."""
    with open(path, "rb") as file:
        return file.read(HEAD_BYTES)


__all__ = [
    "FORMATS",
    "GDAL_FORMATS",
    "HEAD_BYTES",
    "SOURCE_TAGS",
    "check_head",
    "describe_head",
    "format_of",
    "head_matches",
    "read_head",
    "source_tag",
]
