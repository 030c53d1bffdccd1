"""Where ingest inputs come from: local paths, or http(s) URLs downloaded once into a cache.

This is the one copy of the fetch logic; :mod:`geodbk.ingest.ookla` (tile files),
:mod:`geodbk.ingest.regions` (polygon files) and :mod:`geodbk.ingest.urbanrural` (Census
urban areas) all resolve their sources through :func:`local_path`.

Cache layout: ``<cache_dir>/<first 16 hex digits of sha256(url)>/<file name in the URL>``.
Hashing the whole URL keeps two files of the same name (Ookla names every quarter
``..._performance_mobile_tiles.parquet`` under a different folder) apart. A download streams
into a ``.part`` file beside the target that is renamed into place only when complete, so an
interrupted or truncated download leaves nothing behind and the next call starts again.

Limits: a download larger than ``max_bytes`` (default :data:`MAX_DOWNLOAD_BYTES`, 8 GiB; the
CLI's ``--max-download-mb``) or slower than ``deadline_s`` in all (default
:data:`DOWNLOAD_DEADLINE_S`, one hour; ``--download-deadline``) is stopped and refused with a
:class:`~geodbk.errors.ResourceLimitError`, before anything is cached. A body that does not
start the way the URL's file type does (:mod:`geodbk.ingest.formats`; e.g. an HTML error page
sent with status 200 for ``.parquet``) is refused and not cached; a cached file that fails
that check (cached by an older geodbk) is downloaded again.
"""

from __future__ import annotations

import hashlib
import http.client
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from tqdm.auto import tqdm

from geodbk import paths
from geodbk.errors import DownloadError, ResourceLimitError
from geodbk.fileio import atomic_path
from geodbk.ingest.formats import FORMATS, describe_head, head_matches, read_head

#: Bytes read from the server per chunk (at most 1 MiB).
_CHUNK = 1 << 20
#: Largest download accepted by default, bytes (8 GiB; Ookla's quarterly files are below 1 GiB).
MAX_DOWNLOAD_BYTES = 8 << 30
#: Longest a download may take in all by default, seconds (one hour).
DOWNLOAD_DEADLINE_S = 3600.0


@dataclass(frozen=True)
class DownloadLimits:
    """Limits of one download.

    Attributes:
        max_bytes: largest body accepted, bytes.
        deadline_s: longest the whole download may take, seconds.
    """

    max_bytes: int = MAX_DOWNLOAD_BYTES
    deadline_s: float = DOWNLOAD_DEADLINE_S


_LIMITS: ContextVar[DownloadLimits | None] = ContextVar("geodbk_download_limits", default=None)


@contextmanager
def download_limits(max_bytes: int | None = None, deadline_s: float | None = None) -> Iterator[DownloadLimits]:
    """Within the block, downloads use these limits (``None`` keeps the default)."""
    limits = DownloadLimits(
        MAX_DOWNLOAD_BYTES if max_bytes is None else int(max_bytes),
        DOWNLOAD_DEADLINE_S if deadline_s is None else float(deadline_s),
    )
    token = _LIMITS.set(limits)
    try:
        yield limits
    finally:
        _LIMITS.reset(token)


def is_url(source: object) -> TypeGuard[str]:
    """True for an ``http://`` or ``https://`` string."""
    return isinstance(source, str) and source.lower().startswith(("http://", "https://"))


def cache_path(url: str, cache_dir: str | Path | None = None) -> Path:
    """The file that :func:`fetch` stores ``url`` in (it need not exist yet).

    Args:
        url: http(s) URL.
        cache_dir: cache folder; defaults to :data:`geodbk.paths.CACHE_DIR`.
    """
    cache = Path(cache_dir) if cache_dir is not None else paths.CACHE_DIR
    name = Path(urllib.parse.urlparse(url).path).name or "download"
    return cache / hashlib.sha256(url.encode()).hexdigest()[:16] / name


def fetch(url: str, cache_dir: str | Path | None = None, *, timeout: float = 60.0) -> Path:
    """Download ``url`` into the cache once and return the local path.

    A second call for the same URL returns :func:`cache_path` without any request.

    Args:
        url: http(s) URL.
        cache_dir: cache folder; defaults to :data:`geodbk.paths.CACHE_DIR`.
        timeout: seconds to wait for the server.

    Raises:
        DownloadError: not an http(s) URL, the server is unreachable, it answers with an
            HTTP error or with a body that is not the URL's file type, or the connection
            closes before ``Content-Length`` bytes arrived.
        ResourceLimitError: the body is larger, or the download slower, than the limits
            of :func:`download_limits`.
    """
    if not is_url(url):
        raise DownloadError(f"not an http(s) URL: {url!r}")
    target = cache_path(url, cache_dir)
    fmt = FORMATS.get(target.suffix.lower())
    if target.exists():
        if fmt is None or head_matches(read_head(target), fmt):
            return target
        target.unlink()  # a bad body cached by an older geodbk: fetch it again
    target.parent.mkdir(parents=True, exist_ok=True)
    limits = _LIMITS.get() or DownloadLimits()
    start = time.monotonic()
    try:
        with atomic_path(target, suffix=".part") as tmp, open(tmp, "wb") as out, urllib.request.urlopen(
            url, timeout=min(timeout, limits.deadline_s)
        ) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            _check_limits(url, total or 0, start, limits)
            received = 0
            # disable=None: a bar on a terminal only, never lines in a log before an error line
            with tqdm(total=total, unit="B", unit_scale=True, desc=target.name, leave=False, disable=None) as bar:
                while chunk := response.read1(_CHUNK):
                    out.write(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
                    _check_limits(url, received, start, limits)
            if total is not None and received < total:
                raise DownloadError(f"cannot download {url}: connection closed after {received} of {total} bytes")
            out.flush()
            if fmt is not None and not head_matches(head := read_head(tmp), fmt):  # described, none of it quoted
                raise DownloadError(
                    f"cannot download {url}: the server sent a body that is not a {fmt} file "
                    f"({describe_head(head)}); nothing was cached"
                )
    except (DownloadError, ResourceLimitError):
        raise
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as err:
        if isinstance(err, urllib.error.HTTPError):
            reason = f"HTTP {err.code} {err.reason}"
        else:
            reason = str(getattr(err, "reason", err))
        raise DownloadError(f"cannot download {url}: {reason}") from err
    return target


def _check_limits(url: str, size: int, start: float, limits: DownloadLimits) -> None:
    """Raise :class:`ResourceLimitError` when ``size`` bytes exceed ``limits.max_bytes`` or the
    download started at ``start`` (``time.monotonic()``) has run past ``limits.deadline_s``."""
    if size > limits.max_bytes:
        raise ResourceLimitError(
            f"cannot download {url}: it is larger than the download limit of {limits.max_bytes / 1e6:,.6g} MB; "
            "pass --max-download-mb to raise it"
        )
    if time.monotonic() - start > limits.deadline_s:
        raise ResourceLimitError(
            f"cannot download {url}: it took longer than the download deadline of {limits.deadline_s:g} s; "
            "pass --download-deadline to allow more"
        )


def local_path(source: str | Path, cache_dir: str | Path | None = None) -> Path:
    """``source`` as a local path: a URL is fetched into the cache (:func:`fetch`), a path is
    returned as it is (whether it exists is the reader's check).

    Raises:
        DownloadError: a URL cannot be fetched.
    """
    return fetch(source, cache_dir) if is_url(source) else Path(source)
