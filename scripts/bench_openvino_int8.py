"""int8 on OpenVINO's CPU plugin, interleaved in one process: strict f32, edgekit's own QDQ graph, NNCF's QDQ graph
(nncf.quantize on the ONNX model, what an ``quantizer: nncf`` bundle holds) and NNCF on the OpenVINO model (an IR in
memory), every variant once per round in a rotated order; ratios to strict f32. For each int8 variant it also counts
the compiled model's layers by runtime precision (u8/i8 = OpenVINO's low-precision transformations folded the
quantization into int8 kernels; f32 = the FakeQuantize stayed and the layer ran in float) and describes the QDQ graph
(activation type, zero points, per-tensor or per-channel weights).

    python scripts/bench_openvino_int8.py --fp32 B/model.onnx --qdq Q/model.onnx --input image=64x1x8x8 \
        [--calibration edgekit.demos.digits_cnn:calibration_batches] [--rounds 30] [--threads 2]

The result docs/openvino.md quotes is in that file, with the host's CPU flags and load.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shared_setup import cpu_flags, host_conditions, markdown_table  # noqa: E402


def compile_cpu(core: Any, model: Any, threads: int, pinned: bool = False, hint: str = "f32") -> Any:
    """As edgekit's runner compiles (strict f32 float layers, latency mode, threads unpinned), or pinned (OpenVINO's default)."""
    config = {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY", "ENABLE_CPU_PINNING": "YES" if pinned else "NO",
              "INFERENCE_NUM_THREADS": str(threads)}  # fmt: skip
    return core.compile_model(model, "CPU", config)


def runtime_precisions(compiled: Any) -> dict[str, str]:
    """Convolution / MatMul (FullyConnected) layers of the compiled model by runtime precision."""
    counts: Counter[str] = Counter()
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        kind = info["layerType"].astype(str) if "layerType" in info else op.get_type_name()
        if kind in ("Convolution", "FullyConnected", "MatMul", "GroupConvolution"):
            counts[f"{kind}:{info['runtimePrecision'].astype(str) if 'runtimePrecision' in info else '?'}"] += 1
    return dict(sorted(counts.items()))


def describe_qdq(path: Path) -> str:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    activation, weights = set(), Counter()
    for node in model.graph.node:
        if node.op_type != "QuantizeLinear" and node.op_type != "DequantizeLinear":
            continue
        zero = consts.get(node.input[2]) if len(node.input) > 2 else None
        scale = consts.get(node.input[1])
        if node.op_type == "DequantizeLinear" and node.input[0] in consts:  # a weight
            per = "per-channel" if scale is not None and scale.size > 1 else "per-tensor"
            weights[f"{consts[node.input[0]].dtype} {per}, zp {'0' if zero is None or not zero.any() else '!=0'}"] += 1
        elif node.op_type == "QuantizeLinear" and zero is not None:
            activation.add(f"{zero.dtype} zp {'0' if not zero.any() else 'non-zero'}")
    return f"activations {', '.join(sorted(activation)) or '-'}; weights {', '.join(f'{k} x{v}' for k, v in weights.items()) or '-'}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fp32", type=Path, required=True)
    parser.add_argument("--qdq", type=Path, required=True, help="edgekit's int8 QDQ graph (an int8 bundle's model.onnx)")
    parser.add_argument("--input", required=True, help="NAME=DxDxD")
    parser.add_argument("--calibration", default="edgekit.demos.digits_cnn:calibration_batches")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=20, help="timed calls per variant per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--also-pinned", action="store_true", help="also time strict f32 and edgekit QDQ with OpenVINO's pinned threads")
    args = parser.parse_args()

    import nncf
    import onnx
    import openvino as ov

    name, dims = args.input.split("=")
    shape = tuple(int(d) for d in dims.split("x"))
    module, _, func = args.calibration.partition(":")
    batches = getattr(importlib.import_module(module), func)()
    dataset = nncf.Dataset(batches, lambda batch: {name: batch[name]})
    core = ov.Core()
    nncf_onnx = args.qdq.parent / "nncf_qdq.onnx"
    onnx.save(nncf.quantize(onnx.load(str(args.fp32)), dataset), str(nncf_onnx))
    variants = {
        "OpenVINO strict f32": core.read_model(str(args.fp32)),
        "edgekit QDQ int8": core.read_model(str(args.qdq)),
        "NNCF int8 (ONNX QDQ)": core.read_model(str(nncf_onnx)),
        "NNCF int8 (OpenVINO IR)": nncf.quantize(core.read_model(str(args.fp32)), dataset),
    }
    compiled = {label: compile_cpu(core, model, args.threads) for label, model in variants.items()}
    if {"avx512_bf16", "amx_bf16"} & set(cpu_flags(("avx512_bf16", "amx_bf16"))):  # OpenVINO's own default on this CPU
        compiled["OpenVINO bf16 (its default here)"] = compile_cpu(core, variants["OpenVINO strict f32"], args.threads, hint="bf16")
    if args.also_pinned:
        for label in ("OpenVINO strict f32", "edgekit QDQ int8"):
            compiled[f"{label}, threads pinned"] = compile_cpu(core, variants[label], args.threads, pinned=True)
    feeds = {name: np.random.default_rng(0).random(shape, dtype=np.float32)}
    requests = {label: c.create_infer_request() for label, c in compiled.items()}
    reference = requests["OpenVINO strict f32"].infer(feeds)[0].copy()
    times: dict[str, list[float]] = {label: [] for label in compiled}
    labels = list(compiled)
    for round_index in range(args.rounds):
        for label in labels[round_index % len(labels):] + labels[: round_index % len(labels)]:
            request = requests[label]
            request.infer(feeds)
            start = time.perf_counter()
            for _ in range(args.calls):
                request.infer(feeds)
            times[label].append((time.perf_counter() - start) / args.calls * 1e3)
    base = statistics.median(times["OpenVINO strict f32"])
    rows = []
    for label in labels:
        out = requests[label].infer(feeds)[0]
        cosine = float(np.dot(out.ravel(), reference.ravel()) / (np.linalg.norm(out) * np.linalg.norm(reference)))
        median = statistics.median(times[label])
        rows.append([label, f"{median:.3f}", f"{median / base:.2f}", f"{cosine:.5f}",
                     " ".join(f"{k}x{v}" for k, v in runtime_precisions(compiled[label]).items())])  # fmt: skip
    print(f"host: {host_conditions()}, bf16/AMX flags: {cpu_flags(('avx512_bf16', 'amx_bf16', 'amx_int8', 'avx_vnni'))}")
    print(f"OpenVINO {ov.__version__}, NNCF {nncf.__version__}, input {name} {shape}, {args.threads} threads, {args.rounds} rounds x {args.calls} calls")
    print(f"edgekit QDQ: {describe_qdq(args.qdq)}")
    print(f"NNCF QDQ:    {describe_qdq(nncf_onnx)}")
    print(markdown_table(["variant", "median ms", "ratio to f32", "cosine to f32", "compiled conv/matmul layers by precision"], rows,
                         right_aligned=(1, 2, 3)))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
