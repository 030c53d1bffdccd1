"""Atomic writes: an output is either complete at its final path or not there at all.

Every writer stages its output at a hidden temporary path beside the target (same folder,
so the final rename is atomic) and moves it into place only when it is complete:

* :func:`atomic_path` for one file (GeoTIFF, NetCDF, GeoJSON, Parquet, CSV, model files);
* :func:`atomic_dir` for a folder (a Zarr store, a run folder);
* :class:`StagedPath` for writers that stream into the output over many calls (the block
  sinks of :mod:`geodbk.maps.stores`): :meth:`StagedPath.commit` at the end,
  :meth:`StagedPath.discard` on failure.

Temporary names are ``.<name>.<random>.tmp`` (hidden, and never ending in the output's own
suffix, so no reader that globs for ``*.nc`` or ``*.pt`` picks one up). An exception removes
the temporary output and leaves an older file or folder at the target untouched. A process
killed outright (SIGKILL, power loss) can leave the hidden temporary behind, never a partial
output at the target.

Replacing an existing folder takes two renames (old aside, new into place), so for a moment
nothing is at the target; a reader then sees "no output", never a mix of old and new.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


def _remove(path: Path) -> None:
    """Delete a file or folder tree if it is there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@dataclass(frozen=True)
class StagedPath:
    """A hidden temporary file or folder beside ``target`` that becomes ``target`` on :meth:`commit`.

    Attributes:
        target: the final path.
        tmp: where to write meanwhile (created empty: a file, or a folder if ``directory``).
        directory: whether the output is a folder.
    """

    target: Path
    tmp: Path
    directory: bool

    @classmethod
    def beside(cls, target: str | Path, *, directory: bool = False, suffix: str = ".tmp") -> StagedPath:
        """Create the temporary beside ``target`` (creating the parent folder)."""
        target = Path(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        prefix = f".{target.name}."
        if directory:
            tmp = tempfile.mkdtemp(dir=target.parent, prefix=prefix, suffix=suffix)
        else:
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=prefix, suffix=suffix)
            os.close(fd)
        return cls(target, Path(tmp), directory)

    def commit(self) -> Path:
        """Move the finished temporary onto the target (replacing what is there) and return the target.

        Files get mode 0644 and folders 0755 (``mkstemp``/``mkdtemp`` create them private).
        A file replaces a file in one atomic rename. Anything replacing a folder (or a folder
        replacing anything) is swapped in with two renames; should the second fail, the old
        output is put back.
        """
        os.chmod(self.tmp, 0o755 if self.directory else 0o644)
        if not self.directory and not self.target.is_dir():
            os.replace(self.tmp, self.target)
            return self.target
        aside = None
        if self.target.exists() or self.target.is_symlink():
            aside = self.tmp.with_suffix(".old")
            os.rename(self.target, aside)
        try:
            os.rename(self.tmp, self.target)
        except BaseException:
            if aside is not None:
                os.rename(aside, self.target)
            raise
        if aside is not None:
            _remove(aside)
        return self.target

    def discard(self) -> None:
        """Remove the temporary (the target is left as it was)."""
        _remove(self.tmp)


@contextmanager
def _staged(path: str | Path, *, directory: bool, suffix: str) -> Iterator[Path]:
    staged = StagedPath.beside(path, directory=directory, suffix=suffix)
    try:
        yield staged.tmp
        staged.commit()
    finally:
        staged.discard()  # a no-op after a commit: the temporary was renamed away


@contextmanager
def atomic_path(path: str | Path, *, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary file path beside ``path`` to write to; rename it onto ``path`` on success.

    The temporary file (``.<name>.<random><suffix>``, created empty) is removed if the block
    raises, and an existing file at ``path`` is then left as it was. The parent folder is
    created; the final file gets mode 0644.
    """
    with _staged(path, directory=False, suffix=suffix) as tmp:
        yield tmp


@contextmanager
def atomic_dir(path: str | Path, *, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path`` to fill; swap it in for ``path`` on success.

    Whatever is at ``path`` (a folder, e.g. an older Zarr store or run folder, or a file) is
    replaced as a whole when the block ends normally, and left untouched if it raises; the
    temporary folder is then removed. The final folder gets mode 0755.
    """
    with _staged(path, directory=True, suffix=suffix) as tmp:
        yield tmp


__all__ = ["StagedPath", "atomic_dir", "atomic_path"]
