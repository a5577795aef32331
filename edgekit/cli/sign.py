"""``edgekit sign BUNDLE --key PRIVATE.pem``: verify a bundle and write its ``manifest.sig``."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgekit.cli.options import json_parent, print_json, results


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("sign", parents=[json_parent()], help="sign a bundle's manifest with the fleet's private key",
                                   description="Verify a bundle's file hashes, then write manifest.sig: an Ed25519 signature "
                                               "over manifest.json, whose hashes cover every file. Agents refuse unsigned bundles.")  # fmt: skip
    parser.add_argument("bundle", type=Path, metavar="BUNDLE", help="bundle directory")
    parser.add_argument("--key", "-k", type=Path, required=True, metavar="PRIVATE.pem", help="the fleet private key from `edgekit keygen`")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgekit.bundle.signing import sign_bundle
    from edgekit_runtime.signing import load_private_key, public_key_fingerprint

    signature_path = sign_bundle(args.bundle, args.key)
    fingerprint = public_key_fingerprint(load_private_key(args.key).public_key())
    results(args).print(f"[green]signed[/] {args.bundle} -> {signature_path} (key {fingerprint})", soft_wrap=True)
    if args.json:
        print_json({"bundle": str(args.bundle), "signature": str(signature_path), "fingerprint": fingerprint})
    return 0
