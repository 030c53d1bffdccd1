"""Atomic file writes: a file is either complete at its final path or not there at all."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_path(path: str | Path, *, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write to; rename it onto ``path`` on success.

    The temporary file lives in the same folder (so the rename is atomic), is named
    ``.<name>.<random><suffix>`` and is removed if the block raises. The parent folder is
    created; the final file gets mode 0644.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
