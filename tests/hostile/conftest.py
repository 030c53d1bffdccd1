"""The hostile-input harness: run one ``geodbk`` command line in process and check the contract.

Every case of the hostile-input suite (issue 19) is a command line run against a folder of
real files. Whatever the input, the command must

* succeed (exit 0), or fail with exit status 2 (130 after Ctrl-C) and exactly one error line
  on stderr, ``geodbk <command>: error: ...``, the last (one-line warnings may precede it); an
  exception escaping :func:`geodbk.cli.main` is a traceback and fails the case;
* leave the bytes of every file that was there before unchanged, except the paths the case
  names as its intended output;
* leave no staged temporary (``*.tmp``) behind.

Use the ``hostile`` fixture: ``hostile(argv, root, may_change=(), expect=None)`` runs the case
and returns its :class:`Outcome`; ``expect`` is ``"ok"``, ``"refused"`` or ``None`` (either).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from geodbk.cli import main

#: Exit statuses the contract allows for a failure: bad input, and Ctrl-C.
REFUSED = {2, 130}


@dataclass(frozen=True)
class Outcome:
    """What one case did: its exit status and its stderr lines."""

    status: int
    stderr: list[str]

    @property
    def ok(self) -> bool:
        return self.status == 0


@pytest.fixture
def linked_copy(tmp_path) -> Callable[[Path], Path]:
    """Make a fresh copy of a module's folder at ``tmp_path/w``, by hard links: cheap, and a file
    changed in place shows in the snapshot."""

    def copy(base: Path) -> Path:
        root = tmp_path / "w"
        shutil.copytree(base, root, copy_function=os.link)
        return root

    return copy


def snapshot(root: Path) -> dict[Path, str]:
    """SHA-256 of every file under ``root`` (symlinks not followed)."""
    digests: dict[Path, str] = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink():
                digests[path] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def leftovers(root: Path) -> list[Path]:
    """Staged temporaries (``*.tmp``, files or folders) under ``root``."""
    return sorted(p for p in root.rglob("*.tmp"))


def run_cli(argv: Sequence[str]) -> int:
    """``main(argv)``'s exit status, whether it returns it or argparse exits."""
    try:
        return int(main(list(argv)))
    except SystemExit as exit_:
        return int(exit_.code or 0)


@pytest.fixture
def hostile(capsys) -> Callable[..., Outcome]:
    """Run a case and assert the contract (see the module docstring)."""

    def run_case(
        argv: Sequence[str],
        root: Path,
        may_change: Iterable[Path | str] = (),
        expect: str | None = None,
    ) -> Outcome:
        root = Path(root)
        before = snapshot(root)
        capsys.readouterr()
        status = run_cli([str(a) for a in argv])
        lines = capsys.readouterr().err.strip().splitlines()
        outcome = Outcome(status, lines)
        if status != 0:
            assert status in REFUSED, f"exit {status} for {argv}: {lines}"
            assert lines and ": error:" in lines[-1], f"no error line for {argv}: {lines}"
            others = [line for line in lines[:-1] if ": warning:" not in line]
            assert not others, f"more than one error line for {argv}: {lines}"
        if expect == "ok":
            assert outcome.ok, f"refused {argv}: {lines}"
        elif expect == "refused":
            assert not outcome.ok, f"accepted {argv}"
        allowed = {Path(p).resolve() for p in may_change}
        after = snapshot(root)
        changed = [
            p for p, digest in before.items()
            if after.get(p) != digest and not any(p.resolve() == a or a in p.resolve().parents for a in allowed)
        ]
        assert not changed, f"{argv} changed or removed pre-existing files: {changed[:5]}"
        assert not leftovers(root), f"{argv} left temporaries: {leftovers(root)[:5]}"
        return outcome

    return run_case
