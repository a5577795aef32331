"""``edgekit inspect BUNDLE``: print a bundle's manifest and verify every file hash."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgekit.cli.options import console, json_parent, print_json


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("inspect", parents=[json_parent()], help="show a bundle's manifest and verify its file hashes")
    parser.add_argument("bundle", type=Path, help="bundle directory (or a .tar made by `edgekit pack`)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from edgekit.bundle.pack import opened_bundle_path
    from edgekit_runtime.bundle import open_bundle

    with opened_bundle_path(args.bundle) as root:
        bundle = open_bundle(root, verify=True)
    manifest = bundle.manifest
    if args.json:
        print_json({"verified": True, "files": len(manifest["files"]), "manifest": manifest})
        return 0
    table = Table(title=f"{manifest['name']}  [green](all {len(manifest['files'])} file hashes verified)[/]", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    target = manifest["target"]
    parity = (manifest.get("export") or {}).get("parity") or {}
    accuracy = manifest.get("accuracy")
    bench = manifest.get("benchmark") or {}
    rows = [
        ("created", manifest["created"]),
        ("recipe", f"{manifest['recipe']['name']} ({manifest['recipe']['sha256'][:12]})"),
        ("target", f"{target['name']} — {target['display_name']}"),
        ("backend", f"{manifest['backend']['name']} {[p['name'] for p in manifest['backend'].get('execution_providers', [])]}"),
        ("precision", manifest["precision"]),
        ("model", f"{manifest['model']['size_bytes'] / 1e6:.2f} MB, opset {manifest['model']['opset']}"),
        ("inputs", ", ".join(f"{t['name']}: {t['dtype']}{t['shape']}" for t in manifest["io"]["inputs"])),
        ("outputs", ", ".join(f"{t['name']}: {t['dtype']}{t['shape']}" for t in manifest["io"]["outputs"])),
        ("exporter", f"{manifest['export']['exporter']} (opset {manifest['export']['opset']})"),
        ("parity", "skipped" if parity.get("passed") is None else f"max abs diff {parity['max_abs_diff']:.2e}, cosine min {parity['cosine_min']:.6f}, passed {parity['passed']}"),
        ("accuracy", "n/a" if not accuracy else f"{accuracy['metric']} {accuracy['value']:.4f} (reference {accuracy['reference']:.4f}), passed {accuracy['passed']}"),
        ("latency", f"p50 {bench.get('p50_ms', float('nan')):.2f} ms, p99 {bench.get('p99_ms', float('nan')):.2f} ms at {bench.get('shape')}"),
        ("toolchain", ", ".join(f"{k} {v}" for k, v in manifest["toolchain"].items() if v)),
    ]
    for key, value in rows:
        table.add_row(key, str(value))
    console.print(table)
    return 0
