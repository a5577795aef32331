"""``edgekit sweep RECIPE --target NAME``: every precision (and pruning option) the target allows."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgekit.cli.options import console, json_parent, output_parent, print_json, target_parent


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("sweep", parents=[target_parent(), output_parent(), json_parent()],
                                   help="build every precision the target allows; table and Pareto plot of size × latency × accuracy")
    parser.add_argument("recipe", help="recipe YAML file")
    parser.add_argument("--iterations", type=int, default=30, help="timed runs per variant in the interleaved timing (default 30)")
    parser.add_argument("--trust-code", action="store_true", help="let the recipe run callables outside its own folder and edgekit's demos (as edgekit build)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from edgekit.progress import RichStageReporter
    from edgekit.sweep import sweep

    out = Path(args.out) if args.out else Path("bundles") / f"sweep-{Path(args.recipe).stem}-{args.target}"
    result = sweep(args.recipe, args.target, out, force=args.force, iterations=args.iterations, progress=RichStageReporter(console),
                   trust_code=args.trust_code)
    table = Table(title=f"sweep of {args.recipe} on {args.target}")
    for column in ("variant", "status", "size MB", "p50 ms", "× fp32", result.metric or "metric", "note"):
        table.add_column(column)
    for row in result.rows:
        size = row.get("size_bytes")
        table.add_row(
            row["variant"], row["status"], f"{size / 1e6:.2f}" if size else "n/a",
            f"{row['p50_ms']:.2f}" if row.get("p50_ms") else "n/a",
            f"{row['latency_vs_fp32']:.2f}" if row.get("latency_vs_fp32") else "n/a",
            f"{row['metric_value']:.4f}" if row.get("metric_value") is not None else "n/a",
            row.get("reason", ""),
        )
    console.print(table)
    console.print(f"report: {result.out_dir / 'sweep.html'}  data: {result.out_dir / 'sweep.json'}")
    if args.json:
        print_json(result.to_json())
    return 0
