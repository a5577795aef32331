"""``edgekit inspect BUNDLE``: print a bundle's manifest, verify every file hash and, with ``--key``,
its signature.

A ``.tar`` is unpacked by the shared checker (:mod:`edgekit_runtime.archive`): hostile members, a
truncated file or one over ``--max-unpacked-mb`` end with an error that names the member and the
limit (exit 2), and with ``--key`` the signature is checked before any file is written.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from edgekit.cli.options import json_parent, print_json, results


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("inspect", parents=[json_parent()], help="show a bundle's manifest and verify its file hashes and signature",
                                   description="Verify every file hash of a bundle (a directory or a .tar from `edgekit pack`) "
                                               "and, with --key, its signature; then print its manifest.")  # fmt: skip
    parser.add_argument("bundle", type=Path, help="bundle directory (or a .tar made by `edgekit pack`)")
    parser.add_argument("--key", "-k", type=Path, metavar="PUBLIC.pem", help="the fleet public key: verify manifest.sig against it")
    parser.add_argument("--require-signature", action="store_true", help="fail (exit 2) when the bundle is not signed; needs --key")
    parser.add_argument("--max-unpacked-mb", type=float, default=4096, metavar="MB", help="refuse a tar that unpacks to more (default 4096)")
    parser.set_defaults(func=run)


def _dig(data: Any, *keys: str, default: Any = "n/a") -> Any:
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return default
        data = data[key]
    return data


def _tensors(manifest: dict[str, Any], kind: str) -> str:
    tensors = _dig(manifest, "io", kind, default=[])
    return ", ".join(f"{_dig(t, 'name')}: {_dig(t, 'dtype')}{_dig(t, 'shape')}" for t in tensors if isinstance(t, dict))


def _fmt(value: Any, spec: str) -> str:
    """``value`` formatted with ``spec`` when it is a number (a hostile manifest may hold anything)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return format(value, spec)
        except OverflowError:  # an integer past any float
            return f"{str(value)[:20]}… ({len(str(value))} digits)"
    return str(value)


def _ms(bench: Any, key: str) -> str:
    value = _dig(bench, key, default=None)
    return f"{_fmt(value, '.2f')} ms" if isinstance(value, (int, float)) else "n/a"


def measured_where(manifest: Any, timing: bool = True) -> str:
    """Where the manifest's latency and accuracy were measured, for a label: the build host (its CPU), and not on the
    target when the target is another device (inspect may run anywhere, so not "this host"); with ``timing``, what was
    timed when the device runs something else (a TensorRT bundle's graph on ONNX Runtime CPU)."""
    from edgekit.bench.compare import timed_graph_note
    from edgekit.report.formatting import host_cpu, measured_on_target

    where = f"measured on the build host ({host_cpu(manifest)})" if isinstance(_dig(manifest, "benchmark", "host", default=None), dict) \
        else "measured on the build host"
    if not measured_on_target(manifest):
        target = _dig(manifest, "target", "display_name", default=None) or _dig(manifest, "target", "name", default="its target")
        where += f", not on the {target}"
    note = timed_graph_note(manifest) if timing and isinstance(manifest, dict) else None
    return f"{where}; {note}" if note else where


def run(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    from edgekit.bundle.pack import opened_bundle_path
    from edgekit.bundle.signing import SignatureCheck, check_bundle_signature
    from edgekit.errors import BundleError
    from edgekit.report.formatting import fmt_bytes
    from edgekit_runtime.archive import ArchiveLimits
    from edgekit_runtime.bundle import open_bundle

    if args.max_unpacked_mb <= 0:
        raise BundleError(f"--max-unpacked-mb must be positive, got {args.max_unpacked_mb:g}")
    limits = ArchiveLimits(max_unpacked_bytes=int(args.max_unpacked_mb * 1024 * 1024))
    checks: list[SignatureCheck] = []

    def check_manifest(manifest_bytes: bytes, signature_bytes: bytes | None) -> None:
        checks.append(check_bundle_signature(manifest_bytes, signature_bytes, public_key=args.key,
                                             require=args.require_signature, where=str(args.bundle)))  # fmt: skip

    with opened_bundle_path(args.bundle, limits=limits, check_manifest=check_manifest) as root:
        bundle = open_bundle(root, verify=True)
    signature = checks[0] if checks else SignatureCheck("unsigned")
    manifest = bundle.manifest
    if args.json:
        print_json({"verified": True, "files": len(manifest["files"]), "signature": signature.to_dict(), "manifest": manifest})
        return 0
    signed = {
        "verified": f"[green]signature verified (key {signature.key})[/]",
        "unsigned": "[yellow]unsigned[/]",
        "not_checked": "[yellow]signed, signature not checked: pass --key PUBLIC.pem[/]",
    }[signature.status]
    title = f"{escape(str(manifest['name']))}  [green](all {len(manifest['files'])} file hashes verified)[/], {signed}"
    table = Table(title=title, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    parity = _dig(manifest, "export", "parity", default=None) or {}
    accuracy = manifest.get("accuracy")
    bench = manifest.get("benchmark") or {}
    listed = _dig(manifest, "backend", "execution_providers", default=[])
    providers = [_dig(p, "name") for p in (listed if isinstance(listed, list) else []) if isinstance(p, dict)]
    toolchain = _dig(manifest, "toolchain", default={})
    rows = [
        ("created", _dig(manifest, "created")),
        ("bundle_version", _dig(manifest, "bundle_version")),
        ("recipe", f"{_dig(manifest, 'recipe', 'name')} ({str(_dig(manifest, 'recipe', 'sha256'))[:12]})"),
        ("target", f"{_dig(manifest, 'target', 'name')} — {_dig(manifest, 'target', 'display_name')}"),
        ("backend", f"{_dig(manifest, 'backend', 'name')} {providers}"),
        ("precision", manifest["precision"]),
        ("model", f"{fmt_bytes(_dig(manifest, 'model', 'size_bytes'))}, opset {_dig(manifest, 'model', 'opset')}"
         if isinstance(_dig(manifest, "model", "size_bytes", default=None), (int, float)) else f"opset {_dig(manifest, 'model', 'opset')}"),
        ("inputs", _tensors(manifest, "inputs")),
        ("outputs", _tensors(manifest, "outputs")),
        ("exporter", f"{_dig(manifest, 'export', 'exporter')} (opset {_dig(manifest, 'export', 'opset')})"),
        ("parity", "skipped" if not isinstance(parity, dict) or parity.get("passed") is None else
         f"max abs diff {_fmt(parity.get('max_abs_diff'), '.2e')}, cosine min {_fmt(parity.get('cosine_min'), '.6f')}, passed {parity['passed']}"),
        ("accuracy", "n/a" if not isinstance(accuracy, dict) else
         f"{accuracy.get('metric')} {_fmt(accuracy.get('value'), '.4f')} (reference {_fmt(accuracy.get('reference'), '.4f')}), "
         f"passed {accuracy.get('passed')}, {measured_where(manifest, timing=False)}"),
        ("latency", "n/a" if not isinstance(bench, dict) or bench.get("p50_ms") is None else
         f"p50 {_ms(bench, 'p50_ms')}, p99 {_ms(bench, 'p99_ms')} at {_dig(bench, 'shape')}, {measured_where(manifest)}"),
        ("toolchain", ", ".join(f"{k} {v}" for k, v in toolchain.items() if v) if isinstance(toolchain, dict) else str(toolchain)),
    ]  # fmt: skip
    for key, value in rows:
        table.add_row(key, escape(str(value)))
    results(args).print(table)
    return 0
