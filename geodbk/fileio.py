"""Safe writes: an output is complete at its final path or not there, and nothing it did not create is lost.

Every writer stages its output at a hidden temporary path beside the target (same folder,
so the final rename is atomic) and moves it into place only when it is complete:

* :func:`atomic_path` for one file (GeoTIFF, NetCDF, GeoJSON, Parquet, CSV, model files);
* :func:`atomic_dir` for a folder (a Zarr store, a run folder);
* :class:`StagedPath` for writers that stream into the output over many calls (the block
  sinks of :mod:`geodbk.maps.stores`): :meth:`StagedPath.commit` at the end,
  :meth:`StagedPath.discard` on failure;
* :class:`FolderCommit` for several files of one folder that must change together (a run
  folder's models and metrics), under :func:`folder_lock`.

What may be replaced (:func:`check_output`): a file replaces a file; a folder replaces an
empty folder or a folder of the same kind that geodbk wrote, recognised by its marker
(:func:`mark_output`): a :data:`MARKER` file holding the kind in a run folder, and the root
attribute :data:`ZARR_ATTRIBUTE` in a Zarr store (Zarr readers warn about files they do not
know, so a store carries its marker in its own metadata), and a store only while it holds
nothing but its metadata and chunks. Anything else is refused with
:class:`geodbk.errors.OutputExistsError` unless ``overwrite`` is given (or the CLI's
``--overwrite`` is in force, :func:`overwrite_allowed`). Even with ``overwrite``, an output
never replaces one of its own inputs, nor a FIFO, device or socket (``/dev/null`` included: the
rename would replace the device node), and its name must be UTF-8; two outputs of one command
are never at one path (:func:`check_distinct`).

Temporary names are ``.<name>.<pid>-<random>.tmp`` (hidden, and never ending in the output's
own suffix, so no reader that globs for ``*.nc`` or ``*.pt`` picks one up). An exception
(Ctrl-C, SIGTERM and SIGHUP included, see :mod:`geodbk.cli`) removes the temporary and leaves an
older output at the target untouched; a write that fails on a full disk or at the file size
limit (``ulimit -f``) says so (ENOSPC, EFBIG), whatever the writing library called it. A
process killed outright (SIGKILL, power loss) can leave its hidden temporary behind, never a
partial output at the target; the next write into the same folder sweeps temporaries whose
process is gone (:func:`sweep`).

Replacing an existing folder takes two renames (old aside, new into place), so for a moment
nothing is at the target; a reader then sees "no output", never a mix of old and new. A
folder put aside by a process killed between the two renames is put back by :func:`sweep`.

Size: the write rule, the staged names, the sweep and the folder commit are one mechanism
(the sweep finishes interrupted commits and removes staged names by their pid), so they stay
in one module rather than importing each other's internals.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import os
import re
import resource
import shutil
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from geodbk.errors import FolderBusyError, GeodbkError, OutputExistsError, OutputPathError

#: Marker file inside a run folder geodbk wrote; its text is the folder's kind.
MARKER = ".geodbk"
#: Root attribute of a Zarr store geodbk wrote, holding :data:`ZARR_STORE`.
ZARR_ATTRIBUTE = "geodbk_output"
#: Kind of a Zarr store written by geodbk.
ZARR_STORE = "zarr"
#: Kind of a run folder (dataset, models, metrics, maps).
RUN_FOLDER = "run"
_KIND_NAMES = {ZARR_STORE: "Zarr store", RUN_FOLDER: "run folder"}
#: Lock file of :func:`folder_lock`, inside the locked folder.
LOCK = ".geodbk.lock"
#: Journal of a :class:`FolderCommit` whose renames have begun.
JOURNAL = ".geodbk-journal"
#: ``.<name>.<pid>-<random><suffix>``: a staged temporary (``.tmp``, a download's ``.part``) or an
#: older output put aside during a folder swap (``.old``).
_STAGED = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)-[a-z0-9_]+\.(?P<ext>tmp|part|old)$")
#: Free bytes below which a failed write is reported as a full disk.
_FULL_DISK_BYTES = 256 * 1024
#: What is at a path that is neither a regular file nor a folder, by its ``stat`` test.
_SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
#: Metadata files of a Zarr group or array (Zarr 3, and Zarr 2's).
_ZARR_METADATA = frozenset({"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"})
#: A chunk's name, or one part of it: ``0``, ``0.1.2`` (Zarr 2's dotted keys).
_CHUNK_KEY = re.compile(r"^\d+(\.\d+)*$")

_forced = ContextVar("geodbk_overwrite", default=False)


@contextmanager
def overwrite_allowed(allowed: bool = True) -> Iterator[None]:
    """Within the block, every write may replace what stands at its target, as if each were given
    ``overwrite=True`` (the CLI's ``--overwrite``); a write still never replaces its own input."""
    token = _forced.set(allowed)
    try:
        yield
    finally:
        _forced.reset(token)


def _zarr_root_attributes(path: Path) -> tuple[Path, dict]:
    """The file holding a Zarr store's root attributes (``zarr.json`` of Zarr 3, ``.zattrs`` of
    Zarr 2) and their contents; raises OSError or ValueError if there is none."""
    v3 = path / "zarr.json"
    if v3.is_file():
        return v3, json.loads(v3.read_text())
    v2 = path / ".zattrs"
    return v2, json.loads(v2.read_text()) if v2.is_file() else {}


def output_kind(path: str | Path) -> str | None:
    """The kind of folder output geodbk wrote at ``path`` (:data:`ZARR_STORE`, :data:`RUN_FOLDER`),
    read from its marker (:func:`mark_output`), or None."""
    path = Path(path)
    try:
        return (path / MARKER).read_text().strip() or None
    except OSError:
        pass
    try:
        meta_file, meta = _zarr_root_attributes(path)
    except (OSError, ValueError):
        return None
    attributes = meta.get("attributes", {}) if meta_file.name == "zarr.json" else meta
    return ZARR_STORE if isinstance(attributes, dict) and attributes.get(ZARR_ATTRIBUTE) == ZARR_STORE else None


def mark_output(path: str | Path, kind: str) -> None:
    """Mark folder ``path`` as a ``kind`` output of geodbk: the :data:`ZARR_ATTRIBUTE` root
    attribute of a Zarr store, else a :data:`MARKER` file."""
    path = Path(path)
    if kind != ZARR_STORE:
        (path / MARKER).write_text(kind + "\n")
        return
    meta_file, meta = _zarr_root_attributes(path)
    if meta_file.name == "zarr.json":
        meta.setdefault("attributes", {})[ZARR_ATTRIBUTE] = kind
    else:
        meta[ZARR_ATTRIBUTE] = kind
    meta_file.write_text(json.dumps(meta, indent=2))


def _inside(inner: Path, outer: Path) -> bool:
    inner, outer = inner.resolve(), outer.resolve()
    return inner == outer or outer in inner.parents


def _printable(path: str | Path) -> str:
    """``path`` as text that prints: bytes that are not UTF-8 as ``\\xNN`` escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _special(path: Path) -> str | None:
    """What stands at ``path``, or at the end of a symlink there, if it is neither a regular file
    nor a folder (a FIFO, a device, a socket); None otherwise, or if nothing is there."""
    for follow in (False, True):
        try:
            mode = os.stat(path, follow_symlinks=follow).st_mode
        except OSError:  # nothing there, or a symlink to nothing
            continue
        for test, what in _SPECIAL:
            if test(mode):
                return what
    return None


def _zarr_member(parts: tuple[str, ...]) -> bool:
    """Whether the file at ``parts`` inside a Zarr store is one that Zarr writes for an xarray
    dataset: the root group's metadata, or an array's (one folder down) metadata or chunks
    (``<array>/c/0/1`` in Zarr 3, ``<array>/0.1`` or ``<array>/0/1`` in Zarr 2)."""
    if len(parts) == 1:
        return parts[0] in _ZARR_METADATA
    if len(parts) == 2 and parts[1] in _ZARR_METADATA:
        return True
    keys = parts[2:] if parts[1] == "c" else parts[1:]
    return bool(keys) and all(_CHUNK_KEY.match(key) for key in keys)


def _foreign_files(store: Path) -> list[Path]:
    """What Zarr store ``store`` holds besides its metadata and chunks (:func:`_zarr_member`): a
    user's files, and symlinks (geodbk writes none), which replacing the store would delete."""
    foreign: list[Path] = []
    for folder, dirs, files in os.walk(store):
        here = Path(folder)
        foreign += [here / name for name in dirs if (here / name).is_symlink()]
        foreign += [here / name for name in files
                    if (here / name).is_symlink() or not _zarr_member((here / name).relative_to(store).parts)]
    return sorted(foreign)


def holdings(folder: str | Path) -> list[Path]:
    """What ``folder`` holds besides geodbk's own bookkeeping (its :data:`MARKER`, :data:`LOCK`
    and :data:`JOURNAL`, and staged temporaries): [] for an empty or a missing folder."""
    try:
        entries = sorted(Path(folder).iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [entry for entry in entries if entry.name not in (MARKER, LOCK, JOURNAL) and not _STAGED.match(entry.name)]


def _check_parent(path: Path, shown: str) -> None:
    """The nearest existing ancestor of ``path`` must be a writable folder."""
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputPathError(f"cannot write {shown}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot write {shown}: the folder {ancestor} is not writable")


def check_output(
    path: str | Path,
    *,
    kind: str | None = None,
    overwrite: bool = False,
    inputs: Iterable[str | Path] = (),
    name: str | None = None,
) -> None:
    """Raise unless writing ``path`` destroys nothing it should not.

    Args:
        path: the output.
        kind: None for a file output, else the folder kind (:data:`ZARR_STORE`, :data:`RUN_FOLDER`).
        overwrite: replace whatever stands at ``path`` (also forced by :func:`overwrite_allowed`).
        inputs: files the command reads; ``path`` may not be one of them or hold one.
        name: what messages call the output (e.g. ``"--out"``).

    Raises:
        OutputExistsError: ``path`` is (or links to) a FIFO, a device or a socket (even with
            ``overwrite``), is an input or holds one, or (without ``overwrite``) is a folder where
            a file goes, a file where a folder goes, a non-empty folder whose marker is not
            ``kind``, or a Zarr store that holds files which are not the store's.
        OutputPathError: ``path`` is not UTF-8, or a parent of it is a file or not writable.
    """
    path = Path(path)
    shown = f"{name} {_printable(path)}" if name else _printable(path)
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        raise OutputPathError(f"{shown} is not UTF-8 text; name the output in UTF-8 (the libraries that write "
                              "geodbk's formats take UTF-8 paths only)") from None
    if (special := _special(path)) is not None:  # even with overwrite: the rename would replace a device node
        raise OutputExistsError(f"{shown} is {special}, not a regular file; geodbk writes its outputs as regular "
                                "files and folders only, so name a file")
    for given in inputs:
        if _inside(Path(given), path):
            raise OutputExistsError(f"{shown} would replace the input {given}; write the output somewhere else")
    _check_parent(path, shown)
    if overwrite or _forced.get() or not (path.exists() or path.is_symlink()):
        return
    if kind is None:
        if path.is_dir() and not path.is_symlink():
            raise OutputExistsError(f"{shown} is a folder, and a file output replaces only a file; "
                                    "pass --overwrite to replace the folder")
        return
    what = _KIND_NAMES.get(kind, kind)
    if not path.is_dir():
        raise OutputExistsError(f"{shown} is a file, not a {what}; pass --overwrite to replace it")
    if output_kind(path) != kind and any(path.iterdir()):
        raise OutputExistsError(f"{shown} exists and is not a {what} written by geodbk; "
                                "pass --overwrite to replace it as a whole")
    if kind == ZARR_STORE and (foreign := _foreign_files(path)):
        listed = ", ".join(_printable(entry.relative_to(path)) for entry in foreign[:3])
        raise OutputExistsError(f"{shown} is a Zarr store geodbk wrote, but it also holds {len(foreign)} file(s) "
                                f"that are not the store's ({listed}{', ...' if len(foreign) > 3 else ''}); move "
                                "them out, or pass --overwrite to replace the store and them")


def check_distinct(outputs: Mapping[str, str | Path | None]) -> None:
    """Raise :class:`geodbk.errors.OutputExistsError` if two outputs of one command, ``{name: path}``
    (None for one not asked for), are one path or one lies inside the other: the later write
    would replace the earlier."""
    given = [(name, Path(path)) for name, path in outputs.items() if path]
    for (name, path), (other, other_path) in itertools.combinations(given, 2):
        if path.resolve() == other_path.resolve():
            where = f"{name} and {other} both name {_printable(path)}"
        elif _inside(path, other_path):
            where = f"{name} {_printable(path)} lies inside {other} {_printable(other_path)}"
        elif _inside(other_path, path):
            where = f"{other} {_printable(other_path)} lies inside {name} {_printable(path)}"
        else:
            continue
        raise OutputExistsError(f"{where}, and one write would replace the other; give each output its own path")


def _remove(path: Path) -> None:
    """Delete a file or folder tree if it is there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (this one counts as alive)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(folder: str | Path) -> None:
    """Clean up after geodbk processes killed while writing into ``folder``.

    A :class:`FolderCommit` whose renames had begun is finished; staged temporaries are
    removed; a folder put aside during a swap goes back to its name if nothing took its place
    (else it is removed). Only entries of processes that no longer exist are touched.
    """
    folder = Path(folder)
    _finish_commit(folder)
    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    for entry in entries:
        match = _STAGED.match(entry.name)
        if match is None or _alive(int(match["pid"])):
            continue
        target = folder / match["name"]
        if match["ext"] == "old" and not (target.exists() or target.is_symlink()):
            os.rename(entry, target)
        else:
            _remove(entry)


def _staged_name(target: Path) -> str:
    return f".{target.name}.{os.getpid()}-"


def _fsync(path: Path) -> None:
    """Flush a file to the disk, so that a full disk or an I/O error shows now, not after the rename."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def disk_full(folder: str | Path) -> bool:
    """Whether the filesystem of ``folder`` has (almost) no space left for this user."""
    try:
        stats = os.statvfs(folder)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < _FULL_DISK_BYTES


def _size_limit_reached(staged: Path) -> bool:
    """Whether the file ``staged`` has grown to this process's file size limit (``ulimit -f``),
    beyond which every write fails."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    try:
        return limit != resource.RLIM_INFINITY and staged.is_file() and staged.stat().st_size >= limit
    except OSError:
        return False


def _exhausted(path: Path, err: Exception, staged: Path | None) -> OSError | None:
    """What a library's failed write of ``path`` means, whatever the library says: ENOSPC naming
    ``path`` when its disk is full, EFBIG when ``err`` is EFBIG or the file ``staged`` for ``path``
    reached the file size limit; None if neither."""
    if disk_full(path.parent):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    if getattr(err, "errno", None) == errno.EFBIG or (staged is not None and _size_limit_reached(staged)):
        return OSError(errno.EFBIG, os.strerror(errno.EFBIG), str(path))
    return None


def write_failure(path: str | Path, err: Exception, detail: str = "", *, staged: Path | None = None) -> Exception:
    """The error to raise when a library failed to write ``path`` (into the file ``staged``, if
    given, which must still be there): ENOSPC when the disk is full and EFBIG at the file size
    limit (GDAL and netCDF report both as "HDF error" or worse), ``err`` itself if it is another
    OSError or a MemoryError, else an EIO OSError quoting ``detail`` (what the library printed) or
    ``err``."""
    path = Path(path)
    if (exhausted := _exhausted(path, err, staged)) is not None:
        return exhausted
    if isinstance(err, (OSError, MemoryError)):
        return err
    reason = " ".join((detail or f"{type(err).__name__}: {err}").split())
    return OSError(errno.EIO, f"write failed ({reason})", str(path))


@dataclass(frozen=True)
class StagedPath:
    """A hidden temporary file or folder beside ``target`` that becomes ``target`` on :meth:`commit`.

    Attributes:
        target: the final path.
        tmp: where to write meanwhile (created empty: a file, or a folder if ``kind`` is given).
        kind: None for a file, else the folder kind marked on commit (:func:`mark_output`).
        overwrite: replace whatever stands at the target (see :func:`check_output`).
    """

    target: Path
    tmp: Path
    kind: str | None = None
    overwrite: bool = False

    @property
    def directory(self) -> bool:
        return self.kind is not None

    @classmethod
    def beside(
        cls, target: str | Path, *, kind: str | None = None, overwrite: bool = False, suffix: str = ".tmp"
    ) -> StagedPath:
        """Check the target (:func:`check_output`), sweep its folder (:func:`sweep`) and create the
        temporary beside it (creating the parent folder)."""
        target = Path(target)
        check_output(target, kind=kind, overwrite=overwrite)
        target.parent.mkdir(parents=True, exist_ok=True)
        sweep(target.parent)
        if kind is not None:
            tmp = tempfile.mkdtemp(dir=target.parent, prefix=_staged_name(target), suffix=suffix)
        else:
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=_staged_name(target), suffix=suffix)
            os.close(fd)
        return cls(target, Path(tmp), kind, overwrite)

    def commit(self) -> Path:
        """Move the finished temporary onto the target and return the target.

        The target is checked again (something may have appeared meanwhile). A file is flushed
        to the disk first; a folder gets its marker. Files get mode 0644 and folders 0755
        (``mkstemp``/``mkdtemp`` create them private). A file replaces a file in one atomic
        rename; anything else is swapped in with two renames, and should the second fail, the
        old output is put back.
        """
        check_output(self.target, kind=self.kind, overwrite=self.overwrite)
        if self.kind is None:
            _fsync(self.tmp)
        else:
            mark_output(self.tmp, self.kind)
        os.chmod(self.tmp, 0o755 if self.directory else 0o644)
        if not self.directory and not (self.target.is_dir() and not self.target.is_symlink()):
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
def _staged(path: str | Path, *, kind: str | None, overwrite: bool, suffix: str) -> Iterator[Path]:
    staged = StagedPath.beside(path, kind=kind, overwrite=overwrite, suffix=suffix)
    try:
        yield staged.tmp
        staged.commit()
    except Exception as err:  # whatever a writing library raises on a full disk or at the size limit, say so
        exhausted = None if isinstance(err, GeodbkError) else _exhausted(
            staged.target, err, None if staged.directory else staged.tmp)
        if exhausted is None:
            raise
        raise exhausted from err
    finally:
        staged.discard()  # a no-op after a commit: the temporary was renamed away


@contextmanager
def atomic_path(path: str | Path, *, overwrite: bool = False, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary file path beside ``path`` to write to; rename it onto ``path`` on success.

    The temporary file (``.<name>.<pid>-<random><suffix>``, created empty) is removed if the
    block raises, and an existing file at ``path`` is then left as it was; an error raised on a
    full disk becomes OSError ENOSPC, and one raised when the temporary reached the file size
    limit (``ulimit -f``) EFBIG, whatever the writing library called it. A folder at
    ``path`` is refused (:class:`geodbk.errors.OutputExistsError`) unless ``overwrite``. The
    parent folder is created; the final file gets mode 0644.
    """
    with _staged(path, kind=None, overwrite=overwrite, suffix=suffix) as tmp:
        yield tmp


@contextmanager
def atomic_dir(path: str | Path, *, kind: str, overwrite: bool = False, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path`` to fill; swap it in for ``path`` on success.

    ``path`` may be missing, an empty folder or a folder of the same ``kind`` written by
    geodbk (anything else unless ``overwrite``, see :func:`check_output`); it is replaced as a
    whole when the block ends normally, and left untouched if it raises; the temporary folder
    is then removed. The final folder gets mode 0755 and the marker of ``kind`` (:func:`mark_output`;
    a Zarr store must be written by then).
    """
    with _staged(path, kind=kind, overwrite=overwrite, suffix=suffix) as tmp:
        yield tmp


@contextmanager
def folder_lock(folder: str | Path, *, timeout_s: float) -> Iterator[None]:
    """Hold the advisory lock of ``folder`` (``fcntl.flock`` on its :data:`LOCK` file) within the block.

    Waits up to ``timeout_s`` seconds for another process to release it, then raises
    :class:`geodbk.errors.FolderBusyError`. The lock ends with the block, or with the process.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise FolderBusyError(
                        f"{folder} is being written by another geodbk process (waited {timeout_s:g} s); "
                        "try again when it has finished"
                    ) from None
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)


class FolderCommit:
    """Files of one folder that change together: written into a hidden staging folder inside
    ``root``, then moved into place by :meth:`commit`.

    The moves are listed in a journal (:data:`JOURNAL`) before the first one, so a process
    killed midway leaves either the old files (the staging folder is swept) or a journal that
    the next :func:`sweep` of ``root`` finishes. Hold :func:`folder_lock` of ``root`` while
    committing, so that commits do not interleave.
    """

    def __init__(self, root: str | Path, *, overwrite: bool = False) -> None:
        self.root = Path(root)
        self.overwrite = overwrite
        self.root.mkdir(parents=True, exist_ok=True)
        sweep(self.root)
        self.staging = Path(tempfile.mkdtemp(dir=self.root, prefix=".geodbk-commit." + f"{os.getpid()}-",
                                             suffix=".tmp"))

    def path(self, final: str | Path) -> Path:
        """Where to write the file that becomes ``final`` (a path inside ``root``) on commit."""
        staged = self.staging / Path(final).relative_to(self.root)
        staged.parent.mkdir(parents=True, exist_ok=True)
        return staged

    def commit(self) -> list[Path]:
        """Move every staged file into place; return their final paths."""
        files = sorted(str(p.relative_to(self.staging)) for p in self.staging.rglob("*") if not p.is_dir())
        for name in files:
            check_output(self.root / name, overwrite=self.overwrite)
        journal = {"pid": os.getpid(), "staging": self.staging.name, "files": files}
        with atomic_path(self.root / JOURNAL) as tmp:
            tmp.write_text(json.dumps(journal))
        _apply(self.root, journal)
        return [self.root / name for name in files]

    def discard(self) -> None:
        """Remove the staging folder (a no-op after a commit)."""
        _remove(self.staging)


def _apply(root: Path, journal: dict) -> None:
    """Move the journal's staged files into place, remove the staging folder, then the journal."""
    staging = root / journal["staging"]
    for name in journal["files"]:
        source, final = staging / name, root / name
        if not source.exists():  # moved before an interruption
            continue
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.is_dir() and not final.is_symlink():  # only when forced: check_output refused it otherwise
            _remove(final)
        os.replace(source, final)
    _remove(staging)
    (root / JOURNAL).unlink(missing_ok=True)


def _finish_commit(folder: Path) -> None:
    """Finish a :class:`FolderCommit` of ``folder`` whose process died after writing its journal."""
    try:
        journal = json.loads((folder / JOURNAL).read_text())
    except (OSError, ValueError):
        return
    if not _alive(int(journal.get("pid", 0))):
        _apply(folder, journal)


__all__ = [
    "JOURNAL",
    "LOCK",
    "MARKER",
    "RUN_FOLDER",
    "ZARR_ATTRIBUTE",
    "ZARR_STORE",
    "FolderCommit",
    "StagedPath",
    "atomic_dir",
    "atomic_path",
    "check_distinct",
    "check_output",
    "disk_full",
    "folder_lock",
    "holdings",
    "mark_output",
    "output_kind",
    "overwrite_allowed",
    "sweep",
    "write_failure",
]
