"""``edgekit pack BUNDLE``: one tar file for shipping a bundle."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgekit.cli.options import console, json_parent, output_parent, print_json


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("pack", parents=[output_parent(), json_parent()], help="verify a bundle and pack it into one .tar")
    parser.add_argument("bundle", type=Path, help="bundle directory")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgekit.bundle.pack import pack_bundle

    out = pack_bundle(args.bundle, Path(args.out) if args.out else None, force=args.force)
    console.print(f"[green]packed[/] {out} ({out.stat().st_size / 1e6:.2f} MB)")
    if args.json:
        print_json({"tar": str(out), "size_bytes": out.stat().st_size})
    return 0
