"""``edgekit build RECIPE --target NAME``: recipe + target profile -> bundle directory."""

from __future__ import annotations

import argparse

from pathlib import Path
from typing import Any

from rich.markup import escape

from edgekit.cli.options import console, json_parent, library_output_to_stderr, output_parent, print_json, results, target_parent
from edgekit.precision import Backend, Precision
from edgekit.report.formatting import (
    bundle_vs_fp32,
    fmt_bytes,
    fmt_cosine,
    fmt_ms,
    fmt_sci,
    measured_on_target,
    where_measured,
)


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

    with library_output_to_stderr():
        result = build(args.recipe, args.target, precision=args.precision, out=args.out, force=args.force, progress=RichStageReporter(console),
                       backend=args.backend, trust_code=args.trust_code)
    manifest = result.manifest
    results(args).print(summary_text(manifest, result.bundle_dir), soft_wrap=True, highlight=False)
    if args.json:
        print_json({
            "bundle": str(result.bundle_dir),
            "name": manifest["name"],
            "precision": manifest["precision"],
            "size_bytes": manifest["model"]["size_bytes"],
            "parity": manifest["export"]["parity"] or {},
            "vs_fp32": bundle_vs_fp32(manifest),
            "accuracy": manifest["accuracy"],
            "benchmark": manifest["benchmark"],
            "measured_on_target": measured_on_target(manifest),
        })
    return 0


def summary_text(manifest: dict[str, Any], bundle_dir: Path) -> str:
    """The build's summary for people (rich markup): what was built, how close it is to FP32, and the numbers
    measured on this host, labelled as the host's (its CPU named) when the target is another device."""
    bench = manifest["benchmark"]
    parity = manifest["export"]["parity"] or {}
    accuracy = manifest["accuracy"]
    on_host = "" if measured_on_target(manifest) else f", [yellow]measured {escape(where_measured(manifest))}[/]"
    lines = [
        f"[bold green]bundle[/] {escape(str(bundle_dir))}",
        f"  model      {fmt_bytes(manifest['model']['size_bytes'])} ({manifest['precision']}, {manifest['backend']['name']})",
    ]
    if parity.get("passed") is not None:
        lines.append(f"  export     ONNX vs PyTorch: max abs diff {fmt_sci(parity['max_abs_diff'])} (atol {parity['atol']:g}), "
                     f"cosine min {fmt_cosine(parity['cosine_min'])}")  # fmt: skip
    own = bundle_vs_fp32(manifest)
    if manifest["precision"] != "fp32" and own is not None:
        lines.append(f"  vs FP32    {manifest['precision']} bundle on the golden inputs: max abs diff "
                     f"{fmt_sci(own['max_abs_diff'])}, cosine min {fmt_cosine(own['cosine_min'])}")  # fmt: skip
    if accuracy:
        lines.append(f"  accuracy   {accuracy['metric']} {accuracy['value']:.4f} (reference {accuracy['reference']:.4f}, "
                     f"drop {accuracy['drop']:+.4f}){on_host}")  # fmt: skip
    lines.append(f"  latency    p50 {fmt_ms(bench['p50_ms'])}  p99 {fmt_ms(bench['p99_ms'])} at {escape(str(bench['shape']))}"
                 + (on_host or f", measured {escape(where_measured(manifest))}"))
    if not measured_on_target(manifest):  # the device's numbers beside the host's: an estimate (edgekit.estimate)
        from edgekit.estimate.summary import estimate_summary_line

        estimate_line = estimate_summary_line(manifest, bundle_dir)
        if estimate_line:
            lines.append(escape(estimate_line))
    lines.append(f"  report     {escape(str(bundle_dir / 'report.html'))}")
    return "\n".join(lines)
