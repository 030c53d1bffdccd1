"""``geodbk`` command line: ingest, fit, predict, export, summarize, serve and the demo job.

Each subcommand is a thin wrapper over the public API, one module per group:
:mod:`geodbk.cli.data` (ingest, fit), :mod:`geodbk.cli.maps` (predict, export, summarize)
and :mod:`geodbk.cli.jobs` (serve, demo); shared options and checks are in
:mod:`geodbk.cli.options`.

Every failure caused by bad input is one line on stderr, ``geodbk <command>: error: ...``,
with exit status 2: argument errors (unknown options, bad choices, non-numbers) as well as
:class:`geodbk.errors.GeodbkError` raised by the checks and the API (missing or foreign files,
unknown model kinds, bad quarters or resolutions, non-finite training loss, extrapolation
refused). Warnings are printed as one line each too.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

from geodbk.cli import data, jobs, maps
from geodbk.errors import GeodbkError

#: Exit status of every failure caused by bad input.
USAGE_ERROR = 2


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, ``<prog>: error: <message>``, exit status 2
    (argparse's own prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``geodbk`` parser; each subcommand sets ``handler``, a function of the parsed args
    returning the exit status."""
    parser = OneLineParser(
        prog="geodbk",
        description="Deep Basis Kernel GP maps of mobile internet quality from Ookla tiles.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (
        data._add_ingest, data._add_fit, maps._add_predict, maps._add_summarize, maps._add_export,
        jobs._add_serve, jobs._add_demo,
    ):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``geodbk`` with ``argv`` (default ``sys.argv[1:]``) and return the exit status:
    0, or 2 after one ``error:`` line on stderr for bad input."""
    args = build_parser().parse_args(argv)

    def one_line(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        print(f"geodbk {args.command}: warning: {message}", file=sys.stderr)

    try:
        with warnings.catch_warnings():  # restores the default printer afterwards
            warnings.showwarning = one_line
            return int(args.handler(args))
    except GeodbkError as err:
        text = " ".join(str(err).split())  # one line, whatever the message holds
        print(f"geodbk {args.command}: error: {text}", file=sys.stderr)
        return USAGE_ERROR


__all__ = ["build_parser", "main"]
