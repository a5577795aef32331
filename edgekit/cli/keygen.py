"""``edgekit keygen --out DIR``: a new Ed25519 key pair for signing a fleet's bundles."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgekit.cli.options import json_parent, print_json, results


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("keygen", parents=[json_parent()], help="create the Ed25519 key pair that signs a fleet's bundles",
                                   description="Write fleet.key.pem (private: keep it secret, sign bundles with it) and "
                                               "fleet.pub.pem (public: copy it to the devices) into a directory.")  # fmt: skip
    parser.add_argument("--out", "-o", type=Path, required=True, metavar="DIR", help="directory for fleet.key.pem and fleet.pub.pem")
    parser.add_argument("--force", action="store_true", help="replace existing key files (devices trusting the old key will refuse new bundles)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgekit.bundle.signing import PRIVATE_KEY_NAME, PUBLIC_KEY_NAME, generate_keypair

    private_path, public_path = args.out / PRIVATE_KEY_NAME, args.out / PUBLIC_KEY_NAME
    fingerprint = generate_keypair(private_path, public_path, force=args.force)
    printer = results(args)
    printer.print(f"[green]private key[/] {private_path} (keep it secret; sign with `edgekit sign BUNDLE --key {private_path}`)", soft_wrap=True)
    printer.print(f"[green]public key[/]  {public_path} (fingerprint {fingerprint}; copy it to the devices as bundles.public_key)", soft_wrap=True)
    if args.json:
        print_json({"private_key": str(private_path), "public_key": str(public_path), "fingerprint": fingerprint})
    return 0
