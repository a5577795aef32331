"""Options and output shared by several commands, defined once and reused as argparse parent parsers.

Output convention, for every command: results (tables, summaries, JSON, CSV) go to stdout through
:func:`results` / :func:`print_json` / :func:`print_csv`; progress, logs, warnings and errors go to stderr
through :data:`console`. With ``--json`` or ``--csv`` stdout holds only the machine-readable output and
the human summary moves to stderr.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console

#: Progress, logs, warnings and errors: stderr, so stdout stays for results.
console = Console(stderr=True, highlight=False)

#: Width of the results console when stdout is not a terminal (a pipe, a file): wide enough that no table is
#: cut or wrapped. ``COLUMNS`` in the environment overrides it (and the terminal's width on a TTY).
PIPED_WIDTH = 1000


def results_width() -> int | None:
    """Columns for results: ``COLUMNS`` when set, else the terminal's (None: rich asks it), else :data:`PIPED_WIDTH`."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        is_terminal = sys.stdout.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream
        is_terminal = False
    return None if is_terminal else PIPED_WIDTH


def results(args: argparse.Namespace | None = None) -> Console:
    """Where a command prints its human-readable results: stdout (full width and no colour codes when piped),
    or stderr when ``args`` asked for ``--json`` or ``--csv`` (stdout then holds only that)."""
    if args is not None and (getattr(args, "json", False) or getattr(args, "csv", False)):
        return console
    return Console(file=sys.stdout, highlight=False, width=results_width())


def json_parent() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--json", action="store_true", help="print a machine-readable JSON summary as the last line of stdout")
    return parser


def table_output_parent() -> argparse.ArgumentParser:
    """``--json`` or ``--csv``, for commands whose result is a table."""
    parser = argparse.ArgumentParser(add_help=False)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--json", action="store_true", help="print the result as one JSON document on stdout")
    group.add_argument("--csv", action="store_true", help="print the table as CSV on stdout (a header line, then one line per row)")
    return parser


def target_parent(required: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--target", "-t", required=required, metavar="NAME", help="target profile name (see `edgekit targets`) or a .yaml path")
    return parser


def output_parent(metavar: str = "DIR", what: str = "output directory") -> argparse.ArgumentParser:
    """``--out METAVAR`` and ``--force``; name the metavar for what --out takes (``DIR``, ``FILE.tar``)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--out", "-o", metavar=metavar, help=what)
    parser.add_argument("--force", action="store_true", help="replace an existing output")
    return parser


def print_json(payload: Any) -> None:
    """The machine-readable summary: one line of JSON on stdout."""
    sys.stdout.write(json.dumps(payload, default=str, sort_keys=False) + "\n")
    sys.stdout.flush()


def print_csv(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A table as CSV on stdout: the header, then one line per row; ``None`` is an empty cell, floats keep
    their full precision (formatting is for people, CSV is for tools)."""
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if value is None else value for value in row])
    sys.stdout.flush()
