"""The ONNX Runtime engine build: precision conversion, offline graph optimisation that stays portable,
and the execution-provider list (with options) that the device will use."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.errors import BuildError
from edgekit.precision import Backend, Precision
from edgekit.recipe import Recipe
from edgekit.target import TargetProfile

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class EngineBuild:
    model_path: Path
    backend: Backend
    precision: Precision
    execution_providers: list[dict[str, Any]]
    graph_optimization: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_manifest(self, intra_op_threads: int | None) -> dict[str, Any]:
        return {
            "name": self.backend.value,
            "execution_providers": self.execution_providers,
            "graph_optimization": self.graph_optimization,
            "intra_op_threads": intra_op_threads,
            **self.details,
        }


def device_threads(recipe: Recipe, target: TargetProfile) -> int:
    """The intra-op threads the device runs with: the recipe's ``build.benchmark.threads``, else the
    target's CPU cores (never this host's: a Raspberry Pi 5 bundle built here gets the Pi's 4)."""
    return recipe.build.benchmark.threads or target.cpu.cores


def _node_count(model: Any) -> int:
    return len(model.graph.node)


def convert_fp16(model: Any) -> Any:
    """Weights and compute in FP16; inputs and outputs stay as the recipe declares them. BatchNormalizations
    are folded into their convolutions first and nodes reading constants FP16 cannot hold stay FP32
    (:func:`edgekit.engines.fp16.convert_fp16_report`, which also says what it did)."""
    from edgekit.engines.fp16 import convert_fp16_report

    return convert_fp16_report(model)[0]


def _convert_fp16_for(model: Any, cpu_arch: str | None) -> tuple[Any, dict[str, Any]]:
    """The FP16 graph and its manifest record; for CPU providers (``cpu_arch`` set) the record and the build
    log say that fp16 is not a speed-up there."""
    from edgekit.engines.fp16 import CPU_FP16_NOTES, convert_fp16_report

    converted, report = convert_fp16_report(model)
    record = report.to_manifest()
    if cpu_arch in CPU_FP16_NOTES:
        record["note"] = CPU_FP16_NOTES[cpu_arch]
        log.warning("fp16 on a CPU target (%s): %s", cpu_arch, CPU_FP16_NOTES[cpu_arch])
    return converted, record


#: Initializers at least this big go to the optimised graph's own ``.data`` file when the graph keeps external data.
EXTERNAL_INITIALIZER_MIN_BYTES = 1024


def optimize_portable(src: Path, dst: Path, external_data: bool = False) -> None:
    """ONNX Runtime's *basic* graph optimisations (constant folding, redundant-node elimination) saved
    offline. Higher levels insert provider-specific fused ops, so they are applied at load time instead.
    ``external_data``: the weights go to ``<dst>.data`` beside ``dst`` (else ONNX Runtime would write a graph
    pointing at ``src``'s data file, which is staged and deleted)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(dst)
    if external_data:
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", dst.name + ".data")
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", str(EXTERNAL_INITIALIZER_MIN_BYTES))
    try:
        ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        import onnx

        opset = max((o.version for o in onnx.load(str(src), load_external_data=False).opset_import if o.domain in ("", "ai.onnx")), default=None)
        raise BuildError(
            f"ONNX Runtime {ort.__version__} cannot load the graph for the bundle ({src}, opset {opset}): {exc}",
            hint="an operator or attribute the error names is missing at this opset or in this onnxruntime: for a model from "
            "PyTorch set export.opset; for an ONNX file, precisions that need a newer opset upgrade it (manifest export.opset_conversion)",
        ) from None


def build_onnxruntime(model_path: Path, out_path: Path, target: TargetProfile, recipe: Recipe, precision: Precision) -> EngineBuild:
    """Write the bundle's ``model.onnx`` for ``target``: the checked FP32 export (converted for fp16),
    or the graph the quantize stage wrote; the precision was gated against the target before."""
    import onnx

    support = target.backend(Backend.ONNXRUNTIME)
    providers = [{"name": ep.name, "options": dict(ep.options)} for ep in support.execution_providers]
    on_cpu = all(p["name"] == "CPUExecutionProvider" for p in providers)
    details: dict[str, Any] = {"offline_optimization": "basic", "denormal_as_zero": providers[0]["name"] == "CPUExecutionProvider"}
    if precision is Precision.FP32 and on_cpu:
        model_path, details["transformer_fusion"], skipped = _fuse_transformer(model_path, out_path)
        if skipped:
            details["transformer_fusion_skipped"] = skipped
    model = onnx.load(str(model_path), load_external_data=True)
    nodes_in = _node_count(model)
    if precision is Precision.FP16:
        model, details["fp16"] = _convert_fp16_for(model, target.cpu.arch if on_cpu else None)
    staged = out_path.with_name(out_path.stem + ".staged.onnx")
    large = model.ByteSize() > recipe.export.external_data_mb * 2**20
    onnx.save(model, str(staged), save_as_external_data=large, location=staged.name + ".data" if large else None)
    out_path.with_name(out_path.name + ".data").unlink(missing_ok=True)  # ONNX Runtime appends to an existing one
    optimize_portable(staged, out_path, external_data=large)
    details["shared_constants"] = _share_folded_constants(out_path)
    fused = out_path.with_name(out_path.stem + ".fused.onnx")
    for leftover in (staged, staged.with_name(staged.name + ".data"), fused, fused.with_name(fused.name + ".data")):
        leftover.unlink(missing_ok=True)
    optimized = onnx.load(str(out_path), load_external_data=False)
    return EngineBuild(
        model_path=out_path,
        backend=Backend.ONNXRUNTIME,
        precision=precision,
        execution_providers=providers,
        graph_optimization=recipe.build.graph_optimization,
        details={**details, "nodes_in": nodes_in, "nodes_optimized": _node_count(optimized)},
    )


def _share_folded_constants(path: Path) -> dict[str, int] | None:
    """Store once the constants ONNX Runtime's folding duplicated (one copy per If branch); None when the
    graph keeps its weights in external data (left as ONNX Runtime wrote it)."""
    import onnx

    from edgekit.engines.shared_constants import share_constants

    model = onnx.load(str(path), load_external_data=False)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        return None
    shared = share_constants(model)
    if shared["initializers_shared"]:
        onnx.save(model, str(path))
        log.info("%s: %d duplicated constants stored once (%d bytes)", path, shared["initializers_shared"], shared["bytes_saved"])
    return shared


def _fuse_transformer(model_path: Path, out_path: Path) -> tuple[Path, dict[str, int] | None, str | None]:
    """The FP32 graph with ONNX Runtime's transformer fusions when it is a BERT-like encoder (CPU targets:
    the fused ops are ONNX Runtime contrib ops that NPU providers may lack); else the graph as it is.
    The third item says why no fusion was tried (a graph without attention), for the manifest."""
    import onnx

    from edgekit.engines.fusion import NO_ATTENTION, attention_softmaxes, transformer_fusion

    if not attention_softmaxes(onnx.load(str(model_path), load_external_data=False)):
        log.info("transformer fusion skipped for %s: %s", model_path, NO_ATTENTION)
        return model_path, None, NO_ATTENTION
    fused_path = out_path.with_name(out_path.stem + ".fused.onnx")  # removed by build_onnxruntime once used
    fused = transformer_fusion(model_path, fused_path)
    return (fused_path, fused, None) if fused else (model_path, None, None)
