"""``edgekit estimate BUNDLE|RECIPE --target T``: what a model will do on a device (an ESTIMATE)."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgekit.cli.options import json_parent, library_output_to_stderr, print_json, results, target_parent
from edgekit.precision import Precision


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("estimate", parents=[target_parent(), json_parent()],
                                   help="estimate latency, throughput, memory and energy on a target",
                                   description="Estimate what a bundle, ONNX file or recipe will do on a target: p50 latency, "
                                               "throughput, peak memory and energy per inference (per sample) at each power mode. A "
                                               "roofline over the ONNX graph at the benchmark shape, per fused TensorRT layer on a "
                                               "GPU target that builds with TensorRT and per node elsewhere, with efficiency factors "
                                               "per class (defaults, or fitted by `edgekit fleet calibrate`). An estimate, not a "
                                               "measurement: the output lists the factors it rests on.")  # fmt: skip
    parser.add_argument("source", type=Path, metavar="BUNDLE|RECIPE", help="bundle directory, model .onnx, or recipe .yaml")
    parser.add_argument("--power-mode", metavar="MODE", help="power mode to estimate latency at (default: the mode the target's peak is quoted at)")
    parser.add_argument("--calibration", type=Path, metavar="FILE", help="fitted factors from `edgekit fleet calibrate` "
                        "(default: $EDGEKIT_CACHE_DIR/estimate-calibration.json when it exists)")  # fmt: skip
    parser.add_argument("--shape", metavar="DIMS", help="dynamic dims to estimate at, e.g. batch=8,seq=128 (default: the bundle's benchmark shape)")
    parser.add_argument("--precision", choices=[precision.value for precision in Precision], help="time an FP32 graph as this precision (fp16, int8, ...; default: as stored, or the recipe's)")
    parser.add_argument("--measure-host", action="store_true", help="use this host's measured peak (GEMM and copy micro-benchmark, cached) "
                        "instead of the target's figures; automatic for a target without figures that describes this host")  # fmt: skip
    parser.add_argument("--layers", choices=["tensorrt", "per-node"], help="time the graph as TensorRT's fused layers or one "
                        "roofline per ONNX node (default: tensorrt on a GPU target whose preferred backend is TensorRT)")  # fmt: skip
    parser.add_argument("--nodes", action="store_true", help="with --json: include every node's (or layer's) estimated time")
    parser.add_argument("--trust-code", action="store_true", help="a recipe may run callables outside its own folder (as edgekit build)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    from edgekit.bench import parse_dims
    from edgekit.estimate.inputs import estimate_path

    dims = parse_dims(args.shape) if args.shape else None
    with library_output_to_stderr():
        result, source = estimate_path(args.source, args.target, power_mode=args.power_mode, calibration=args.calibration,
                                       dims=dims, precision=args.precision,
                                       measure_host=True if args.measure_host else None, trust_code=args.trust_code,
                                       layer_model=args.layers)  # fmt: skip
    printer = results(args)
    mode = f" at {result.power_mode}" if result.power_mode else ""
    heading = f"{source.name} on {result.target}{mode} ({result.engine}, batch {result.batch}, dims {result.cost.dims or 'static'})"
    printer.print(f"[bold]ESTIMATE[/] for {escape(heading)}")  # names come from the graph and the bundle: no markup
    printer.print(f"  p50 latency     {result.p50_ms:.3f} ms (estimate)")
    printer.print(f"  throughput      {result.throughput_text()} (estimate)")
    printer.print(f"  peak memory     {result.peak_memory_mb:.1f} MB (estimate: weights {result.weights_mb:.1f} + activations "
                  f"{result.activations_mb:.1f} + runtime {result.runtime_overhead_mb:.0f})")  # fmt: skip
    # the bundle's own host measurement, at its benchmark shape and precision: comparable only when the estimate is at both
    differs = [what for what, same in ((f"--shape {args.shape}", {**source.dims, **(dims or {})} == source.dims),
                                       (f"--precision {args.precision}", args.precision in (None, source.precision))) if not same]
    if source.measured_p50_ms is not None:
        measured = (f"{source.measured_p50_ms:.3f} ms p50 at {source.dims or 'static'}, {source.precision}, on the build host "
                    f"({source.measured_on or 'unknown CPU'})")  # fmt: skip
        verdict = f"not comparable: the estimate is at {' and '.join(differs)}" if differs else "for comparison"
        printer.print(f"  host measured   {escape(measured)}, {escape(verdict)}", soft_wrap=True)
    if result.energy:
        energy = Table(title=f"energy per inference (one sample) at each power mode (estimate; one call = batch {result.batch})")
        for column in ("mode", "watts", "p50 ms / call", "mJ / call", "mJ / inference"):
            energy.add_column(column, justify="right" if column != "mode" else "left")
        for mode_energy in result.energy:
            energy.add_row(escape(mode_energy.power_mode), f"{mode_energy.watts:g}", f"{mode_energy.latency_ms:.3f}",
                           f"{mode_energy.energy_per_call_mj:.3g}", f"{mode_energy.energy_per_inference_mj:.3g}")  # fmt: skip
        printer.print(energy)
    else:
        printer.print(f"  energy          {escape(result.no_energy_text())}", soft_wrap=True)
    table = Table(title="by node class (estimate)")
    for column in ("class", "nodes", "GOPs", "MB moved", "ms", "share"):  # MB: 10^6 bytes, as every size edgekit writes
        table.add_column(column, justify="right" if column != "class" else "left")
    for cls, row in sorted(result.by_class.items(), key=lambda item: -item[1]["ms"]):
        table.add_row(cls, f"{row['nodes']:.0f}", f"{row['ops'] / 1e9:.3f}", f"{row['bytes'] / 1e6:.2f}", f"{row['ms']:.3f}", f"{row['share']:.0%}")
    printer.print(table)
    printer.print("factors:")
    for factor in result.factors:
        printer.print(f"  - {escape(factor)}", soft_wrap=True)
    if args.json:
        doc = result.to_json(nodes=args.nodes)
        doc["source"] = {"name": source.name, "model": str(source.model_path), "measured_p50_ms": source.measured_p50_ms,
                         "measured_on": source.measured_on, "measured_dims": source.dims, "measured_precision": source.precision,
                         "measured_comparable": not differs if source.measured_p50_ms is not None else None}  # fmt: skip
        print_json(doc)
    return 0
