"""``edgekit pack BUNDLE [--out FILE.tar]``: one tar file for shipping a bundle."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape

from edgekit.cli.options import json_parent, output_parent, print_json, results
from edgekit.report.formatting import fmt_bytes


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "pack", parents=[output_parent("FILE.tar", "the tar file to write (default: BUNDLE.tar next to the bundle)"), json_parent()],
        help="verify a bundle and pack it into one .tar",
        description="Verify every file hash of a bundle, then write it (with its manifest.sig, if signed) into one "
                    "tar file for `edgekit fleet deploy` or `edgekit-agent install`.",
    )  # fmt: skip
    parser.add_argument("bundle", type=Path, metavar="BUNDLE", help="bundle directory")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgekit.bundle.pack import bundle_id, pack_bundle

    out = pack_bundle(args.bundle, Path(args.out) if args.out else None, force=args.force)
    size, identity = out.stat().st_size, bundle_id(args.bundle)
    results(args).print(f"[green]packed[/] {escape(str(out))} ({fmt_bytes(size)}), bundle id {escape(identity)}", soft_wrap=True)
    if args.json:
        print_json({"tar": str(out), "size_bytes": size, "bundle_id": identity})
    return 0
