"""``edgekit sweep RECIPE --target NAME``: every precision (and pruning option) the target allows."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape

from edgekit.cli.options import (
    check_count,
    console,
    library_output_to_stderr,
    output_parent,
    print_csv,
    print_json,
    results,
    table_output_parent,
    target_parent,
)

#: ``edgekit sweep --csv``: the raw fields of each variant.
CSV_COLUMNS = ("variant", "precision", "pruned", "status", "size_bytes", "p50_ms", "p99_ms", "latency_vs_fp32", "metric_value",
               "metric_reference", "cosine_min", "passed", "budget_line", "bundle", "reason",
               "estimate_p50_ms", "estimate_throughput_per_s", "estimate_energy_mj", "estimate_power_mode")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sweep", parents=[target_parent(), output_parent("DIR", "directory for the variants' bundles, sweep.json and sweep.html "
                                                          "(default bundles/sweep-RECIPE-TARGET)"), table_output_parent()],
        help="build every precision the target allows; table and Pareto plot of size × latency × accuracy",
        description="Build every precision (and pruning option) the target allows, time the ones this host runs "
                    "interleaved, and write a table and a Pareto plot (sweep.html) of size, latency and accuracy.",
    )  # fmt: skip
    parser.add_argument("recipe", metavar="RECIPE", help="recipe YAML file")
    parser.add_argument("--iterations", type=int, default=30, metavar="N", help="timed runs per variant in the interleaved timing, 1 or more (default 30)")
    parser.add_argument("--trust-code", action="store_true", help="let the recipe run callables outside its own folder and edgekit's demos (as edgekit build)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from edgekit.progress import RichStageReporter
    from edgekit.report.sweep_plot import sweep_cells, sweep_title
    from edgekit.sweep import sweep

    check_count(args.iterations, "--iterations", minimum=1, example=30)
    from edgekit.target import get_target

    target_name = get_target(args.target).name  # a --target given as a YAML path names the folder by the target's name
    out = Path(args.out) if args.out else Path("bundles") / f"sweep-{Path(args.recipe).stem}-{target_name}"
    with library_output_to_stderr():
        result = sweep(args.recipe, args.target, out, force=args.force, iterations=args.iterations, progress=RichStageReporter(console),
                       trust_code=args.trust_code)
    if args.json:
        print_json(result.to_json())
    elif args.csv:
        print_csv(CSV_COLUMNS, ([row.get(column) for column in CSV_COLUMNS] for row in result.rows))
    table = Table(title=f"sweep of {escape(sweep_title(result.recipe, result.target, result.batch))}")
    estimated = any(row.get("estimate_p50_ms") is not None for row in result.rows)  # a target other than this host
    latency = "p50 ms on this host" if estimated else "p50 ms"  # another device's bundles, timed here: say so
    for column in ("variant", "status", "size", latency, "× fp32", result.metric or "metric", "cosine min", "note"):
        table.add_column(escape(column), justify="right" if column not in ("variant", "status", "note") else "left")
    if estimated:
        table.add_column(f"estimate p50 ms on {escape(target_name)}", justify="right")
    for row in result.rows:
        extra = [f"{row['estimate_p50_ms']:.2f}" if row.get("estimate_p50_ms") is not None else "-"] if estimated else []
        table.add_row(*(escape(cell) for cell in [*sweep_cells(row), *extra]))
    printer = results(args)
    printer.print(table)
    printer.print(f"report: {escape(str(result.out_dir / 'sweep.html'))}  data: {escape(str(result.out_dir / 'sweep.json'))}",
                  soft_wrap=True)  # fmt: skip
    if not any(row["status"] == "built" for row in result.rows):  # a sweep that built nothing failed, as a failed build does
        failed = [row for row in result.rows if row["status"] == "failed"]
        console.print(f"[bold red]error:[/] no variant of the sweep built ({len(failed)} of {len(result.rows)} failed"
                      + (f"; the first: {escape(failed[0]['reason'])})" if failed else ")"), soft_wrap=True)
        console.print("  [yellow]hint:[/] the table's note column says why each variant failed; fix that and run the sweep again "
                      "with --force", soft_wrap=True)  # fmt: skip
        return 2
    return 0
