"""Where ingest inputs come from: local paths, or http(s) URLs downloaded once into a cache.

This is the one copy of the fetch logic; :mod:`geodbk.ingest.ookla` (tile files),
:mod:`geodbk.ingest.regions` (polygon files) and :mod:`geodbk.ingest.urbanrural` (Census
urban areas) all resolve their sources through :func:`local_path`.

Cache layout: ``<cache_dir>/<first 16 hex digits of sha256(url)>/<file name in the URL>``.
Hashing the whole URL keeps two files of the same name (Ookla names every quarter
``..._performance_mobile_tiles.parquet`` under a different folder) apart. A download streams
into a ``.part`` file beside the target that is renamed into place only when complete, so an
interrupted or truncated download leaves nothing behind and the next call starts again.
"""

from __future__ import annotations

import hashlib
import http.client
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TypeGuard

from tqdm.auto import tqdm

from geodbk import paths
from geodbk.errors import DownloadError
from geodbk.fileio import atomic_path

#: Bytes read from the server per chunk (1 MiB).
_CHUNK = 1 << 20


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
            HTTP error, or the connection closes before ``Content-Length`` bytes arrived.
    """
    if not is_url(url):
        raise DownloadError(f"not an http(s) URL: {url!r}")
    target = cache_path(url, cache_dir)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(target, suffix=".part") as tmp, open(tmp, "wb") as out, urllib.request.urlopen(
            url, timeout=timeout
        ) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            received = 0
            with tqdm(total=total, unit="B", unit_scale=True, desc=target.name, leave=False) as bar:
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
            if total is not None and received < total:
                raise DownloadError(f"cannot download {url}: connection closed after {received} of {total} bytes")
    except DownloadError:
        raise
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as err:
        if isinstance(err, urllib.error.HTTPError):
            reason = f"HTTP {err.code} {err.reason}"
        else:
            reason = str(getattr(err, "reason", err))
        raise DownloadError(f"cannot download {url}: {reason}") from err
    return target


def local_path(source: str | Path, cache_dir: str | Path | None = None) -> Path:
    """``source`` as a local path: a URL is fetched into the cache (:func:`fetch`), a path is
    returned as it is (whether it exists is the reader's check).

    Raises:
        DownloadError: a URL cannot be fetched.
    """
    return fetch(source, cache_dir) if is_url(source) else Path(source)
