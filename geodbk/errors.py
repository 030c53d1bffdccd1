"""Exceptions raised by geodbk on bad input.

Every error that a user can cause by pointing geodbk at the wrong file, region or
column derives from :class:`GeodbkError`, so that the CLI can print one clear line
instead of a traceback.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager


class GeodbkError(Exception):
    """Base class for all user-facing geodbk errors."""


class InputDataError(GeodbkError, ValueError):
    """A file or table is missing columns, has NaN targets, a wrong CRS, or is corrupt."""


class RegionError(GeodbkError, ValueError):
    """A region name is unknown, or clipping to it leaves no data."""


class DownloadError(GeodbkError, OSError):
    """A URL could not be fetched."""


class ExtrapolationWarning(UserWarning):
    """A model is asked about places or quarters outside what it was fitted on."""


@contextmanager
def extrapolation_said() -> Iterator[None]:
    """Silence :class:`ExtrapolationWarning` inside: for a second look at places that have been
    warned about already (a model's kriging part reads the deep part's places)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        yield


class TrainingError(GeodbkError, FloatingPointError):
    """Training diverged: the loss became NaN or infinite, or a Cholesky factor kept failing."""


class ResourceLimitError(GeodbkError, ValueError):
    """A request would take more memory, disk, time or download than geodbk's limit; the
    message names the option that raises the limit."""


class DroppedRowsWarning(UserWarning):
    """Input rows failed a check and were dropped (and counted) instead of used."""


class OutputExistsError(GeodbkError, FileExistsError):
    """An output path holds something the write would destroy: a folder where a file goes, a folder
    that geodbk did not write, or one of the command's own inputs."""


class OutputPathError(GeodbkError, OSError):
    """An output cannot be written where asked: a parent of the path is a file, or not writable."""


class FolderBusyError(GeodbkError, BlockingIOError):
    """Another geodbk process holds the lock of a run folder for longer than this one waits."""


class Terminated(KeyboardInterrupt):
    """The process got SIGTERM during a CLI run; raised like Ctrl-C so that staged outputs are removed."""
