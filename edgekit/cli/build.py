"""``edgekit build RECIPE --target NAME``: recipe + target profile -> bundle directory."""

from __future__ import annotations

import argparse

from edgekit.cli.options import console, json_parent, output_parent, print_json, target_parent
from edgekit.precision import Backend, Precision


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "build",
        parents=[target_parent(), output_parent(), json_parent()],
        help="export, check, build, evaluate and benchmark a recipe into a bundle",
        description="Export the recipe's model to ONNX, check parity with PyTorch, build it for the target, "
        "evaluate the accuracy budget, benchmark on this host and write a bundle directory.",
    )
    parser.add_argument("recipe", help="recipe YAML file (see recipes/)")
    parser.add_argument("--precision", "-p", choices=[p.value for p in Precision] + ["auto"],
                        help="override the recipe's build.precision (auto: the fastest plan inside the accuracy budget)")
    parser.add_argument("--backend", "-b", choices=[b.value for b in Backend], help="override the recipe's build.backend and the target's preference")
    parser.add_argument("--trust-code", action="store_true",
                        help="let the recipe run callables outside its own folder and edgekit's demos (installed packages, "
                        "other folders); only for recipes you trust, as you would a setup.py")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgekit.pipeline import build
    from edgekit.progress import RichStageReporter

    result = build(args.recipe, args.target, precision=args.precision, out=args.out, force=args.force, progress=RichStageReporter(console),
                   backend=args.backend, trust_code=args.trust_code)
    manifest = result.manifest
    bench = manifest["benchmark"]
    parity = manifest["export"]["parity"] or {}
    accuracy = manifest["accuracy"]
    console.print(f"[bold green]bundle[/] {result.bundle_dir}")
    console.print(f"  model      {manifest['model']['size_bytes'] / 1e6:.2f} MB ({manifest['precision']}, {manifest['backend']['name']})")
    if parity.get("passed") is not None:
        console.print(f"  parity     max abs diff {parity['max_abs_diff']:.2e} (atol {parity['atol']:g}), cosine min {parity['cosine_min']:.6f}")
    if accuracy:
        console.print(f"  accuracy   {accuracy['metric']} {accuracy['value']:.4f} (reference {accuracy['reference']:.4f}, drop {accuracy['drop']:+.4f})")
    console.print(f"  latency    p50 {bench['p50_ms']:.2f} ms  p99 {bench['p99_ms']:.2f} ms  at {bench['shape']} on this host")
    console.print(f"  report     {result.bundle_dir / 'report.html'}")
    if args.json:
        print_json({
            "bundle": str(result.bundle_dir),
            "name": manifest["name"],
            "precision": manifest["precision"],
            "size_bytes": manifest["model"]["size_bytes"],
            "parity": parity,
            "accuracy": accuracy,
            "benchmark": bench,
        })
    return 0
