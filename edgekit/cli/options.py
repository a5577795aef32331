"""Options shared by several commands, defined once and reused as argparse parent parsers."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console

#: Human-readable output goes to stderr so that ``--json`` leaves stdout machine-readable.
console = Console(stderr=True, highlight=False)


def json_parent() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--json", action="store_true", help="print a machine-readable JSON summary as the last line of stdout")
    return parser


def target_parent(required: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--target", "-t", required=required, metavar="NAME", help="target profile name (see `edgekit targets`) or a .yaml path")
    return parser


def output_parent() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--out", "-o", metavar="DIR", help="output directory")
    parser.add_argument("--force", action="store_true", help="replace an existing output")
    return parser


def print_json(payload: Any) -> None:
    """The machine-readable summary: one line of JSON on stdout."""
    sys.stdout.write(json.dumps(payload, default=str, sort_keys=False) + "\n")
    sys.stdout.flush()
