"""The package's folders show its one-way flow, and imports follow it.

The contract is in pyproject.toml ([tool.importlinter]); import-linter builds the import
graph of ``geodbk`` (function-level and TYPE_CHECKING imports included) and fails on any
import from a lower layer to a higher one.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "geodbk"


def _lint(package_parent: Path, config: Path) -> subprocess.CompletedProcess:
    """Run import-linter on the ``geodbk`` found under ``package_parent`` with ``config``."""
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True))"
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run(
        [sys.executable, "-c", code, str(config)], cwd=package_parent, env=env, capture_output=True, text=True
    )


def test_imports_follow_the_layers() -> None:
    result = _lint(ROOT, ROOT / "pyproject.toml")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "1 kept, 0 broken" in result.stdout


def test_the_layer_contract_catches_an_upward_import(tmp_path: Path) -> None:
    """A copy of the package whose model layer imports the trainer breaks the contract."""
    copy = tmp_path / "geodbk"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    bad = copy / "models" / "backbone.py"
    bad.write_text(bad.read_text() + "\nfrom geodbk.fit.train import fit_arrays  # noqa: E402,F401\n")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    result = _lint(tmp_path, tmp_path / "pyproject.toml")
    assert result.returncode != 0
    assert "geodbk.models.backbone -> geodbk.fit.train" in result.stdout


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_are_small_or_say_why(path: Path) -> None:
    """No module is over ~450 lines unless its docstring gives the reason (a line starting 'Size:')."""
    lines = path.read_text().count("\n")
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert lines <= 450 or "Size:" in doc, f"{path.relative_to(ROOT)} has {lines} lines and no 'Size:' reason"
