"""Options the ``edgekit fleet`` commands share (:mod:`edgekit.cli.fleet`, :mod:`edgekit.cli.fleet_collect`), and
argparse types that refuse a bad value when the command line is parsed (``error: argument --port: ...``)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

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


def _within(text: str, what: str, holds: Callable[[float], bool], refusal: str) -> float:
    """``text`` as a finite number for which ``holds`` is true, else an argparse error: "'text' is <refusal>: give <what>"."""
    value = finite_number(text, what)
    if not holds(value):
        raise argparse.ArgumentTypeError(f"{text!r} is {refusal}: give {what}")
    return value


def positive_seconds(text: str) -> float:
    """A finite number of seconds above 0 (a health window, a timeout)."""
    return _within(text, "a number of seconds above 0, e.g. 60", lambda v: v > 0, "not above 0")


def share(text: str) -> float:
    """A share from 0 to 1 (0.02 is 2 %)."""
    return _within(text, "a share from 0 to 1, e.g. 0.02 for 2 %", lambda v: 0 <= v <= 1, "not from 0 to 1")


def growth_ratio(text: str) -> float:
    """A finite ratio above 0 (1.5: may grow by half; below 1 demands that it shrink)."""
    return _within(text, "a ratio above 0, e.g. 1.5 (may grow by half)", lambda v: v > 0, "not above 0")


def name_list(text: str) -> tuple[str, ...]:
    """``A,B``: one or more comma-separated names (blanks around them dropped)."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names nothing: give one or more names separated by commas, e.g. jetson-orin-nano-8gb,raspberry-pi-5")
    return names
