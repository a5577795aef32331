"""The graph a runtime actually executes: ONNX Runtime's CPU graph after its optimisations, for the targets
whose model runs on ONNX Runtime's CPU execution provider on this host (``x86-64-cpu`` from a measured peak).

ONNX Runtime at ``ORT_ENABLE_ALL`` (the bench's level) folds constants, fuses Conv+BatchNorm+activation
(``FusedConv``, NCHWc ``Conv`` with an activation and a residual ``Sum``), MatMul+Add (``FusedGemm``), LayerNorm,
SkipLayerNorm, GELU / BiasGelu / QuickGelu, Transpose+MatMul (``FusedMatMul``) and, on x86, rewrites convolutions
to the NCHWc layout with ``ReorderInput`` / ``ReorderOutput`` nodes at the layout's edges. Instead of guessing
those rules, the estimate saves the graph ONNX Runtime built (``SessionOptions.optimized_model_filepath``) and
costs THAT graph with ``fusion="runtime"``: what it fused is one node, what it left runs as written.
TensorRT and NPU targets keep the exported graph with the implicit epilogue fusions of
:mod:`edgekit.estimate.graph_cost` (their compilers fuse at least as much).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgekit.estimate.graph_cost import EstimateError, GraphCost, graph_costs


def optimize_like_onnxruntime(model_path: Path, out_path: Path, threads: int) -> Path:
    """Save the graph ONNX Runtime (CPU EP, ORT_ENABLE_ALL, ``threads`` intra-op threads) runs for ``model_path``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.optimized_model_filepath = str(out_path)
    options.log_severity_level = 3
    try:
        ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT cannot load it: the caller costs the exported graph instead and says so
        raise EstimateError(f"ONNX Runtime {ort.__version__} cannot load {model_path}: {exc}",
                            hint="estimate the exported graph (fusion='implicit'), or fix the graph so ONNX Runtime loads it") from None  # fmt: skip
    return out_path


def runtime_graph_costs(model: Any, threads: int, *, dims: Mapping[str, int] | None = None, input_shapes: Mapping[str, Any] | None = None,
                        input_values: Mapping[str, Any] | None = None) -> GraphCost:  # fmt: skip
    """The per-node work of the graph ONNX Runtime runs for ``model`` (a path or ModelProto) on this host;
    where ONNX Runtime cannot load it, the exported graph with implicit fusions, said in the assumptions."""
    import onnx

    with tempfile.TemporaryDirectory(prefix="edgekit-ort-graph-") as tmp:
        source = Path(model) if isinstance(model, (str, Path)) else Path(tmp) / "model.onnx"
        if not isinstance(model, (str, Path)):
            onnx.save(model, str(source))
        try:
            optimized = optimize_like_onnxruntime(source, Path(tmp) / "ort-optimized.onnx", threads)
        except EstimateError as exc:
            cost = graph_costs(source, dims, input_shapes=input_shapes, input_values=input_values)
            return _with_note(cost, f"costed the exported graph with implicit fusions: {exc}")
        cost = graph_costs(optimized, dims, input_shapes=input_shapes, input_values=input_values, fusion="runtime")
        return _with_note(cost, f"costed the graph ONNX Runtime runs here (ORT_ENABLE_ALL, {threads} threads, its fusions and layout)")


def _with_note(cost: GraphCost, note: str) -> GraphCost:
    from dataclasses import replace

    return replace(cost, assumptions=(note, *cost.assumptions))
