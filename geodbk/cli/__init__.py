"""``geodbk`` command line: ingest, fit, predict, export, summarize, update, plan, serve and the demo job.

Each subcommand is a thin wrapper over the public API, one module per group:
:mod:`geodbk.cli.data` (ingest, fit), :mod:`geodbk.cli.maps` (predict, export, summarize)
:mod:`geodbk.cli.decisions` (update, plan) and :mod:`geodbk.cli.jobs` (serve, demo); shared options and checks are in
:mod:`geodbk.cli.options`.

Every failure is one line on stderr, ``geodbk <command>: error: ...``
(:mod:`geodbk.cli.failures`): exit status 2 for bad input (unknown options, bad choices,
non-numbers, non-finite values, :class:`geodbk.errors.GeodbkError` raised by the checks and
the API), for what the system refuses (an unwritable folder, a full disk, a parent path that
is a file) and for resource limits (out of memory); 130 after Ctrl-C, 143 after SIGTERM (staged
outputs are removed in both cases); 1 for a failure no check foresaw. ``--debug`` shows the
traceback instead. Warnings are printed as one line each too.

Every writing subcommand takes ``--overwrite``: replace whatever stands at its outputs (by
default an output replaces only its own kind of thing, :func:`geodbk.fileio.check_output`).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

from geodbk.cli import data, decisions, jobs, maps
from geodbk.cli.failures import USAGE_ERROR, failure, one_line, sigterm_as_exception
from geodbk.fileio import overwrite_allowed

#: Subcommands that write files, each with ``--overwrite``.
WRITING_COMMANDS = ("ingest", "fit", "predict", "summarize", "export", "update", "plan", "demo")


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, ``<prog>: error: <message>``, exit status 2
    (argparse's own prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``geodbk`` parser; each subcommand sets ``handler``, a function of the parsed args
    returning the exit status."""
    parser = OneLineParser(
        prog="geodbk",
        description="Deep Basis Kernel GP maps of mobile internet quality from Ookla tiles.",
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of a failure (default: one line)")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (
        data._add_ingest, data._add_fit, maps._add_predict, maps._add_summarize, maps._add_export,
        decisions._add_update, decisions._add_plan, jobs._add_serve, jobs._add_demo,
    ):
        add(sub)
    for name, command in sub.choices.items():
        # after the subcommand too; SUPPRESS keeps a --debug given before it
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show the traceback of a failure (default: one line)")
        if name in WRITING_COMMANDS:
            command.add_argument("--overwrite", action="store_true",
                                 help="replace whatever stands at the output paths (default: an output "
                                 "replaces only a file, or a store or run folder that geodbk wrote)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``geodbk`` with ``argv`` (default ``sys.argv[1:]``) and return the exit status: 0, or
    after one ``error:`` line on stderr 2 (bad input, system refusals, resource limits), 130
    (Ctrl-C), 143 (SIGTERM) or 1 (a bug); see :mod:`geodbk.cli.failures`."""
    args = build_parser().parse_args(argv)
    printed: set[str] = set()

    def print_warning(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                      line: Any = None) -> None:
        text = f"geodbk {args.command}: warning: {one_line(str(message))}"
        if text not in printed:  # once per run: a filter change inside a step resets Python's own record
            printed.add(text)
            print(text, file=sys.stderr)

    try:
        with warnings.catch_warnings(), sigterm_as_exception(), overwrite_allowed(getattr(args, "overwrite", False)):
            warnings.showwarning = print_warning  # catch_warnings restores the default printer afterwards
            return int(args.handler(args))
    except (Exception, KeyboardInterrupt) as err:
        if args.debug:
            raise
        status, text = failure(err)
        print(f"geodbk {args.command}: error: {text}", file=sys.stderr)
        return status


__all__ = ["WRITING_COMMANDS", "build_parser", "main"]
