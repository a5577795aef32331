"""``edgekit keygen --out DIR``: a new Ed25519 key pair for signing a fleet's bundles."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgekit.cli.options import console, json_parent, print_json


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("keygen", parents=[json_parent()], help="create the Ed25519 key pair that signs a fleet's bundles")
    parser.add_argument("--out", "-o", type=Path, required=True, metavar="DIR", help="directory for fleet.key.pem and fleet.pub.pem")
    parser.add_argument("--force", action="store_true", help="replace existing key files (devices trusting the old key will refuse new bundles)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgekit.bundle.signing import PRIVATE_KEY_NAME, PUBLIC_KEY_NAME, generate_keypair

    private_path, public_path = args.out / PRIVATE_KEY_NAME, args.out / PUBLIC_KEY_NAME
    fingerprint = generate_keypair(private_path, public_path, force=args.force)
    console.print(f"[green]private key[/] {private_path} (keep it secret; sign with `edgekit sign BUNDLE --key {private_path}`)")
    console.print(f"[green]public key[/]  {public_path} (fingerprint {fingerprint}; copy it to the devices as bundles.public_key)")
    if args.json:
        print_json({"private_key": str(private_path), "public_key": str(public_path), "fingerprint": fingerprint})
    return 0
