"""Options and output shared by several commands, defined once and reused as argparse parent parsers.

Output convention, for every command: results (tables, summaries, JSON, CSV) go to stdout through
:func:`results` / :func:`print_json` / :func:`print_csv`; progress, logs, warnings and errors go to stderr
through :data:`console`. With ``--json`` or ``--csv`` stdout holds only the machine-readable output and
the human summary moves to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from rich.console import Console


#: Width of the results console when stdout is not a terminal (a pipe, a file): wide enough that no table is
#: cut or wrapped. ``COLUMNS`` in the environment overrides it (and the terminal's width on a TTY).
PIPED_WIDTH = 1000


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or odd stream
        return False


def _stdout_is_terminal() -> bool:
    return _is_terminal(sys.stdout)


def results_width(stream: Any = None) -> int | None:
    """Columns for results written to ``stream`` (stdout by default): ``COLUMNS`` when set, else the terminal's
    (None: rich asks it), else :data:`PIPED_WIDTH`."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return None if _is_terminal(sys.stdout if stream is None else stream) else PIPED_WIDTH


#: Progress, logs, warnings and errors: stderr, so stdout stays for results. Not cut at 80 columns when stderr is
#: a pipe or a log file (a banner wrapped mid-phrase there): as wide as results are (``COLUMNS``, else the terminal's).
console = Console(stderr=True, highlight=False, width=results_width(sys.stderr))


class _TrimmedLines:
    """A text stream that drops the spaces rich pads table lines with, for results written to a pipe or file."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._pending = ""

    def write(self, text: str) -> int:
        if not text.isascii():  # an unpaired surrogate (a hostile manifest's text) as an escape, not a crash
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        *lines, self._pending = (self._pending + text).split("\n")
        if lines:
            self._stream.write("".join(line.rstrip(" ") + "\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self._stream.write(self._pending.rstrip(" "))
            self._pending = ""
        self._stream.flush()

    def isatty(self) -> bool:
        return False


def results(args: argparse.Namespace | None = None) -> Console:
    """Where a command prints its human-readable results: stdout (full width, no colour codes and no trailing
    padding when piped), or stderr when ``args`` asked for ``--json`` or ``--csv`` (stdout then holds only that)."""
    if args is not None and (getattr(args, "json", False) or getattr(args, "csv", False)):
        # the human results move to stderr, and are no more cut there than on stdout when it is not a terminal
        return Console(stderr=True, highlight=False, width=results_width(sys.stderr))
    if _stdout_is_terminal():
        return Console(file=sys.stdout, highlight=False, width=results_width())
    return Console(file=_TrimmedLines(sys.stdout), highlight=False, width=results_width())


@contextlib.contextmanager
def library_output_to_stderr() -> Iterator[None]:
    """While a command does its work, whatever the libraries it calls print goes to stderr, at both levels
    (``sys.stdout`` and file descriptor 1): NNCF's progress bars, ONNX Runtime's optimizer, C++ libraries
    writing to fd 1. Stdout holds the results the command prints afterwards, so ``--json`` is one JSON
    document for ``jq``. (A library's progress on stderr is still progress a person sees.)"""
    if sys.stdout is not None:  # None: stdout was closed when Python started (main() points it at /dev/null)
        sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)


def check_count(value: int | None, option: str, minimum: int, example: int) -> None:
    """Refuse a count option below ``minimum`` (``--iterations 0``, ``--threads -2``) with an error that names the option,
    before any work (the library's own check would name a manifest field or a keyword argument instead)."""
    from edgekit.errors import EdgekitError

    if value is not None and value < minimum:
        raise EdgekitError(f"{option} must be {minimum} or more, not {value}", hint=f"pass {option} N with N >= {minimum}, e.g. {option} {example}")


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


@contextlib.contextmanager
def _reader_may_leave() -> Iterator[None]:
    """Stdout's reader left early (``edgekit sweep --csv | head -1``): exit 1 quietly, as rich does under its tables,
    with stdout pointed at /dev/null so the flush at exit has no traceback either."""
    try:
        yield
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        raise SystemExit(1) from None


def print_json(payload: Any) -> None:
    """The machine-readable summary: one line of JSON on stdout."""
    with _reader_may_leave():
        sys.stdout.write(json.dumps(payload, default=str, sort_keys=False) + "\n")
        sys.stdout.flush()


def print_csv(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A table as CSV on stdout: the header, then one line per row; ``None`` is an empty cell, floats keep
    their full precision (formatting is for people, CSV is for tools)."""
    with _reader_may_leave():
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if value is None else _not_a_formula(value) for value in row])
        sys.stdout.flush()


_FORMULA_START = re.compile(r"^(?:[=+@\t\r]|-(?![0-9.]))")


def _not_a_formula(value: Any) -> Any:
    """Text a spreadsheet would run as a formula (a device-reported bundle id such as ``=HYPERLINK(...)``) starts
    with an apostrophe instead, as spreadsheets write it themselves; numbers and other text are unchanged."""
    return "'" + value if isinstance(value, str) and _FORMULA_START.match(value) else value
