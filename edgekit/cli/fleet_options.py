"""Options the ``edgekit fleet`` commands share (:mod:`edgekit.cli.fleet`, :mod:`edgekit.cli.fleet_collect`)."""

from __future__ import annotations

import argparse

DEFAULT_STORE = "sqlite:///fleet.db"


def store_option(parser: argparse.ArgumentParser) -> None:
    """``--store URL``: the fleet store a command reads or writes."""
    parser.add_argument("--store", default=DEFAULT_STORE, metavar="URL",
                        help=f"sqlite:///PATH.db or postgresql://USER@HOST/DB (default {DEFAULT_STORE})")  # fmt: skip
