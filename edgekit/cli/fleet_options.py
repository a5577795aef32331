"""Options the ``edgekit fleet`` commands share (:mod:`edgekit.cli.fleet`, :mod:`edgekit.cli.fleet_collect`), and
argparse types that refuse a bad value when the command line is parsed (``error: argument --port: ...``)."""

from __future__ import annotations

import argparse
import math

DEFAULT_STORE = "sqlite:///fleet.db"
#: The largest TCP port.
MAX_PORT = 65535


def store_option(parser: argparse.ArgumentParser) -> None:
    """``--store URL``: the fleet store a command reads or writes."""
    parser.add_argument("--store", default=DEFAULT_STORE, metavar="URL",
                        help=f"sqlite:///PATH.db or postgresql://USER@HOST/DB (default {DEFAULT_STORE})")  # fmt: skip


def port_number(text: str) -> int:
    """A TCP port: a whole number from 0 (the system picks a free one) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number: give a whole number from 0 to {MAX_PORT}") from None
    if not 0 <= port <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"port {port} is out of range: give a whole number from 0 to {MAX_PORT} "
                                         "(0 picks a free one)")  # fmt: skip
    return port


def finite_number(text: str, what: str = "a number of seconds, hours or days") -> float:
    """A number that is neither NaN nor infinite."""
    try:
        number = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: give {what}") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number: give {what}")
    return number


def positive_seconds(text: str) -> float:
    """A finite number of seconds above 0 (a health window, a timeout)."""
    what = "a number of seconds above 0, e.g. 60"
    seconds = finite_number(text, what)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not above 0: give {what}")
    return seconds


def share(text: str) -> float:
    """A share from 0 to 1 (0.02 is 2 %)."""
    what = "a share from 0 to 1, e.g. 0.02 for 2 %"
    value = finite_number(text, what)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not from 0 to 1: give {what}")
    return value


def growth_ratio(text: str) -> float:
    """A finite ratio above 0 (1.5: may grow by half; below 1 demands that it shrink)."""
    what = "a ratio above 0, e.g. 1.5 (may grow by half)"
    value = finite_number(text, what)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not above 0: give {what}")
    return value


def name_list(text: str) -> tuple[str, ...]:
    """``A,B``: one or more comma-separated names (blanks around them dropped)."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names nothing: give one or more names separated by commas, e.g. jetson-orin-nano-8gb,raspberry-pi-5")
    return names
