"""``edgekit bench BUNDLE``: latency on this host, optionally side by side with PyTorch eager."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgekit.cli.options import check_count, json_parent, library_output_to_stderr, print_json, results


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", parents=[json_parent()], help="benchmark a bundle on this host",
                                   description="Time a bundle on this host (p50/p90/p99, throughput), optionally side "
                                               "by side with PyTorch eager on the same inputs, interleaved.")  # fmt: skip
    parser.add_argument("bundle", type=Path, metavar="BUNDLE", help="bundle directory")
    parser.add_argument("--shape", metavar="DIMS", help="dynamic dims to time at, e.g. batch=8,seq=128 (default: opt)")
    parser.add_argument("--iterations", "-n", type=int, default=50, metavar="N", help="timed runs per variant, 1 or more (default 50)")
    parser.add_argument("--warmup", type=int, default=10, metavar="N", help="untimed runs first, 0 or more (default 10)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: ONNX Runtime's CPU provider (default); cuda: onnxruntime-gpu's CUDA provider on this host's NVIDIA GPU, "
                             "with host I/O, device-resident I/O and CUDA-graph variants and NVML energy per inference")
    parser.add_argument("--threads", type=int, metavar="N", help="intra-op threads for both ONNX Runtime and PyTorch, 1 or more (default: the target's cores, at most this host's)")
    parser.add_argument("--vs-pytorch", action="store_true", help="also time PyTorch eager on the same inputs (needs the recipe)")
    parser.add_argument("--recipe", type=Path, metavar="FILE", help="recipe file, when it moved since the build")
    parser.add_argument("--trust-code", action="store_true", help="with --vs-pytorch: let the recipe run callables outside its own folder and edgekit's demos (as edgekit build)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    from edgekit.bench import bench_bundle, parse_dims

    check_count(args.iterations, "--iterations", minimum=1, example=50)
    check_count(args.warmup, "--warmup", minimum=0, example=10)
    check_count(args.threads, "--threads", minimum=1, example=4)
    with library_output_to_stderr():
        report = bench_bundle(args.bundle, parse_dims(args.shape), iterations=args.iterations, warmup=args.warmup,
                              vs_pytorch=args.vs_pytorch, threads=args.threads, recipe_path=args.recipe, trust_code=args.trust_code,
                              device=args.device)
    if report.device == "cpu":
        where = f"on this host (CPU {report.host_cpu}, {report.threads} threads)"
    else:
        where = f"on this host ({report.device} on {', '.join(report.providers)})"
    if report.target:  # another device's bundle, timed here: say so, as the build summary does
        where += f", not on the {report.target}"
    title = f"{args.bundle} at {report.dims} {where}, {report.iterations} runs each"  # a line of its own: a table title wraps
    table = Table()
    energy = any("energy" in v for v in report.variants.values())
    # per inference is per item (one sample), as edgekit estimate's column; a call runs the whole batch
    for column in ("variant", "p50 ms", "p90 ms", "p99 ms", "mean ms", "per second",
                   *(("mJ / call", "mJ / inference", "mean W") if energy else ())):  # fmt: skip
        table.add_column(column, justify="right" if column != "variant" else "left")
    for name, v in report.variants.items():
        cells = [f"{v['p50_ms']:.3f}", f"{v['p90_ms']:.3f}", f"{v['p99_ms']:.3f}", f"{v['mean_ms']:.3f}", f"{v['throughput_per_s']:.1f}"]
        if energy:
            joules = v.get("energy")
            cells += [f"{joules['mj_per_call']:.4g}", f"{joules['mj_per_inference']:.4g}", f"{joules['mean_w']:.0f}"] if joules else ["-"] * 3
        table.add_row(escape(name), *cells)
    printer = results(args)
    printer.print(f"[bold]{escape(title)}[/]", soft_wrap=True)
    printer.print(table)
    if energy:
        printer.print(f"energy: mJ / call is one call of batch {report.batch}; mJ / inference is per item (one sample)")
    if report.graph_note:
        printer.print(f"timed: {escape(report.graph_note)}", soft_wrap=True)
    for note in ([report.energy_note] if report.energy_note else []) + report.notes:
        printer.print(escape(note), soft_wrap=True)
    if "ratio_vs_pytorch_p50" in report.variants.get("bundle", {}):
        printer.print(f"bundle / PyTorch eager (p50): [bold]{report.variants['bundle']['ratio_vs_pytorch_p50']:.2f}×[/]")
    if args.json:
        print_json(report.to_json())
    return 0
