"""Entry point of the ``edgekit`` command. Each command group lives in its own module and exposes
``register(subparsers)``; the handler it sets as ``func`` takes the parsed args and returns an exit code."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from edgekit import __version__
from rich.markup import escape

from edgekit.cli.options import console
from edgekit.errors import EdgekitError

#: Command modules, in the order ``--help`` lists them.
COMMAND_MODULES = (
    "edgekit.cli.build",
    "edgekit.cli.sweep",
    "edgekit.cli.inspect",
    "edgekit.cli.bench",
    "edgekit.cli.estimate",
    "edgekit.cli.pack",
    "edgekit.cli.keygen",
    "edgekit.cli.sign",
    "edgekit.cli.targets",
    "edgekit.cli.schema",
    "edgekit.cli.fleet",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edgekit", description="Take a trained PyTorch model to edge devices.")
    parser.add_argument("--version", action="version", version=f"edgekit {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def _closed_stdout_to_devnull() -> None:
    """Started with stdout closed (``edgekit inspect X >&-``), Python has ``sys.stdout = None`` and file descriptor 1
    free: point both at /dev/null, so the command still runs and its results go where the caller sent them (nowhere)."""
    fd = os.open(os.devnull, os.O_WRONLY)
    if fd != 1:
        os.dup2(fd, 1)
        os.close(fd)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)


def main(argv: list[str] | None = None) -> int:
    if sys.stdout is None:
        _closed_stdout_to_devnull()
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if args.verbose < 2:
        # The exporters log every skipped optional op and every pass at INFO/WARNING; keep the CLI readable.
        for noisy in ("torch.onnx", "onnxscript", "onnx_ir", "torch._export", "torch.export"):
            logging.getLogger(noisy).setLevel(logging.ERROR)
    try:
        return int(args.func(args) or 0)
    except EdgekitError as exc:
        console.print(f"[bold red]error:[/] {escape(exc.message)}", soft_wrap=True)
        if exc.hint:
            console.print(f"  [yellow]hint:[/] {escape(exc.hint)}", soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        console.print("[red]interrupted[/]")
        return 130


if __name__ == "__main__":
    sys.exit(main())
