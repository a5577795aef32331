"""The ONNX Runtime candidate builder of ``auto``: writes each candidate of one FP32 model with the ONNX Runtime
writers of this package, making each graph variant once (pre-processing and the exact float rewrites; transformer
fusion) and calibrating each (graph, calibrator) once, with the calibration cache."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.engines.fusion import transformer_fusion
from edgekit.errors import QuantizationError
from edgekit.precision import Precision
from edgekit.quantize import cnn_folding
from edgekit.quantize.calibration import CalibrationCache, CalibrationError, CalibratorSpec, TensorRange, calibrate
from edgekit.quantize.candidates import EXPORTED, BuiltCandidate, Candidate
from edgekit.quantize.ort import default_plan, dynamic, graph_files, int4, layout, static_plan, static_qdq
from edgekit.quantize.ort.candidates import FLOAT_REWRITES, INT8_ORT_DEFAULT, ORT_DEFAULT, TRANSFORMER_FUSION
from edgekit.quantize.plan import INT8_OP_TYPES, QuantizationPlan

log = logging.getLogger(__name__)


class OrtCandidateBuilder:
    """Writes candidates of one FP32 model into ``work_dir``; calibrates each graph variant once."""

    def __init__(self, fp32_path: Path, work_dir: Path, calibration_batches: Sequence[Mapping[str, np.ndarray]],
                 calibrators: Mapping[str, CalibratorSpec], cache: CalibrationCache | None = None) -> None:
        """``calibrators`` maps the names plans use (``plan.calibrator``) to calibrator specs."""
        if not calibrators:
            raise QuantizationError("the candidate builder needs at least one calibrator", hint="pass {'minmax': CalibratorSpec.create('minmax')}")
        self.fp32_path = Path(fp32_path)
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.calibration_batches = [dict(batch) for batch in calibration_batches]
        self.calibrators = dict(calibrators)
        self.cache = cache
        self._graphs: dict[str, Path] = {}
        self._ranges: dict[tuple[str, str], dict[str, TensorRange]] = {}
        self.fusion_stats: dict[str, int] | None = None
        self.fold_counts: Any = None
        #: Calibration runs over the data (cache misses) and cache hits, for the search's stats.
        self.calibration_passes = 0
        self.calibration_cache_hits = 0
        #: What the calibrations found in the cache took when they ran: a plain int8 build pays them (the search's
        #: time budget counts them, see :attr:`edgekit.quantize.pricing.TimeBudget.plain_s`).
        self.cached_calibration_s = 0.0
        #: Seconds of work a plain int8 build does not do: making graph variants (transformer fusion: 2.3 s of MiniLM's
        #: 14 s estimate) and ONNX Runtime's default plan's MinMax pass when the shared calibration came from the cache
        #: without it. The search's time budget leaves them out of its plain int8 estimate.
        self.auto_only_s = 0.0
        #: Collect ONNX Runtime's default plan's MinMax ranges in the first calibration of its graph (auto sets
        #: this when it lists int8-ort-default); they stay ``None`` until then, or when that came from the cache alone.
        self.collect_ort_default = False
        self.ort_default_ranges: dict[str, TensorRange] | None = None

    def graph_model(self, graph: str) -> Path | None:
        """The FP32 model of a graph variant (``None`` when the variant does not apply to this model)."""
        if graph == FLOAT_REWRITES:
            return self.graph_model(EXPORTED)
        if graph == ORT_DEFAULT:
            self.graph_model(EXPORTED)
            return self._graphs[ORT_DEFAULT]
        if graph not in self._graphs:
            if graph == EXPORTED:  # with the exact CNN rewrites static int8 gets (edgekit.quantize.cnn_folding)
                pre = graph_files.preprocess(self.fp32_path, self.work_dir / "fp32-exported.onnx")
                self._graphs[ORT_DEFAULT] = pre
                self._graphs[graph], self.fold_counts = cnn_folding.fold_for_int8(pre, self.work_dir / "fp32-exported-folded.onnx")
            elif graph == TRANSFORMER_FUSION:
                target = self.work_dir / "fp32-transformer-fusion.onnx"
                fusing = time.perf_counter()
                self.fusion_stats = transformer_fusion(self.fp32_path, target)
                self.auto_only_s += time.perf_counter() - fusing
                if self.fusion_stats is None:
                    return None
                self._graphs[graph] = target
            else:
                raise QuantizationError(f"unknown graph variant '{graph}'", hint=f"use '{EXPORTED}' or '{TRANSFORMER_FUSION}'")
        return self._graphs[graph]

    def ranges(self, graph: str, plan: QuantizationPlan) -> dict[str, TensorRange]:
        """Calibrated ranges for every tensor ``plan`` needs on ``graph``, calibrating only what is new."""
        model = self.graph_model(graph)
        if model is None:
            raise QuantizationError(f"graph variant '{graph}' does not apply to {self.fp32_path}")
        name = plan.calibrator or next(iter(self.calibrators))
        if name not in self.calibrators:
            raise QuantizationError(f"plan names calibrator '{name}', which the candidate builder was not given", hint=f"builder calibrators: {', '.join(self.calibrators)}")
        have = self._ranges.setdefault((graph, name), {})
        needed = [tensor for tensor in static_plan.calibration_tensors(model, _int8_only(plan)) if tensor not in have]
        if needed:
            ort_default = self.collect_ort_default and self.ort_default_ranges is None and model == self._graphs.get(ORT_DEFAULT)
            also = default_plan.minmax_tensors(model) if ort_default else []
            self.collect_ort_default = self.collect_ort_default and not ort_default  # one try: the first calibration of its graph
            try:
                result = calibrate(model, self.calibration_batches, self.calibrators[name], tensor_names=needed, cache=self.cache,
                                   work_dir=self.work_dir, also_minmax=also)
            except CalibrationError as exc:  # a tensor only ONNX Runtime's plan reads cannot be observed: calibrate the plan's alone
                if not also:
                    raise
                log.info("int8-ort-default's ranges not collected beside %s's calibration (%s): it calibrates on its own", graph, exc.message)
                also = []
                result = calibrate(model, self.calibration_batches, self.calibrators[name], tensor_names=needed, cache=self.cache, work_dir=self.work_dir)
            self.calibration_cache_hits += result.from_cache
            self.calibration_passes += not result.from_cache
            self.cached_calibration_s += result.seconds if result.from_cache else 0.0
            self.auto_only_s += result.minmax_only_seconds
            have.update(result.ranges)
            if also and result.minmax is not None:
                self.ort_default_ranges = result.minmax
        return have

    def has_ranges(self, candidate: Candidate) -> bool:
        """``candidate`` needs no calibration pass of its own: ONNX Runtime's default plan once its MinMax
        ranges were collected beside an earlier calibration of the same graph (the search prices it as cheap)."""
        return candidate.name == INT8_ORT_DEFAULT and self.ort_default_ranges is not None

    def __call__(self, candidate: Candidate) -> BuiltCandidate:
        built = self._write(candidate)
        if built.path == self.fp32_path:
            return built
        shared = built.path in self._graphs.values()  # a graph variant's FP32 model, which the writers read: keep it
        out = built.path.with_name(f"{built.path.stem}.no-shapes.onnx") if shared else built.path
        return replace(built, path=graph_files.without_shape_annotations(built.path, out))

    def _write(self, candidate: Candidate) -> BuiltCandidate:
        model = self.graph_model(candidate.graph)
        if model is None:
            raise QuantizationError(f"graph variant '{candidate.graph}' does not apply to {self.fp32_path}")
        out = self.work_dir / f"{re.sub(r'[^A-Za-z0-9_.+-]', '_', candidate.name)}.onnx"
        plan = candidate.plan
        if candidate.precision is Precision.FP32:
            return BuiltCandidate(model if candidate.graph != EXPORTED else self.fp32_path)
        if candidate.graph == ORT_DEFAULT and candidate.precision is Precision.INT8:
            if self.ort_default_ranges is not None:  # collected in the shared calibration's pass: no second one
                written = default_plan.write_with_ranges(model, out, self.ort_default_ranges)
            else:
                written = default_plan.write_ort_default_static(model, out, self.calibration_batches)
            if not graph_files.quantized_ops(written):
                raise QuantizationError(f"{candidate.name}: ONNX Runtime's quantize_static quantized nothing in this graph, so it is not an int8 plan",
                                        hint="the FP32 candidates cover this model")
            return BuiltCandidate(written)
        if candidate.precision is Precision.FP16:
            import onnx

            from edgekit.engines.onnxruntime import convert_fp16

            # The graph the pipeline builds when auto chooses fp16 (the FP32 export, converted by the engine
            # builder), not the pre-processed one the int8 candidates start from: PP-OCR's detector passed
            # as the latter and failed the bundle's own evaluation as the former (cosine 0.53).
            source = self.fp32_path if candidate.graph == EXPORTED else model
            converted = convert_fp16(onnx.load(str(source), load_external_data=True))
            return BuiltCandidate(graph_files.save_model(converted, out))
        if plan is None:
            raise QuantizationError(f"candidate {candidate.name} ({candidate.precision.value}) has no quantization plan")
        if candidate.precision is Precision.INT8:
            ranges = self.ranges(candidate.graph, plan)
            plan = static_qdq.write_static_qdq_around_failures(model, out, plan, ranges)  # type: ignore[arg-type]  # TensorRange has min/max
            if not graph_files.quantized_ops(out):
                raise QuantizationError(f"{candidate.name}: the plan quantized nothing (no Q/DQ or integer op written), so it is not an int8 plan",
                                        hint="every quantizable node is kept in higher precision; the FP32 candidate covers this")
            missed = unquantized_nodes(out, plan)
            if missed:
                raise QuantizationError(
                    f"{candidate.name}: the writers left {len(missed)} node(s) the plan quantizes in float: {', '.join(missed[:5])}",
                    hint="the graph changed under quantization (a node was renamed or split); exclude these nodes explicitly",
                )
            used = {name: ranges[name] for name in static_plan.calibration_tensors(model, _int8_only(plan))}
            return BuiltCandidate(out, used, plan if plan != candidate.plan else None)  # the nodes kept float go to the manifest
        if candidate.precision is Precision.INT8_DYNAMIC:
            written = dynamic.write_dynamic(model, out, plan)
            coverage = dynamic.dynamic_coverage_note(model, plan)
            if not graph_files.quantized_ops(written):
                raise QuantizationError(f"{candidate.name}: int8-dynamic quantized nothing in this graph, so it is not an int8-dynamic plan",
                                        hint=coverage or "the graph has no MatMul/Gemm weights")
            if coverage:  # PP-OCR's classifier: 0.3 % of its weights int8, chosen as 'int8-dynamic' for the float rewrites' speed
                raise QuantizationError(f"{candidate.name}: {coverage}; a plan that leaves most weights float is not offered as int8-dynamic",
                                        hint="the int8 and FP32 candidates cover this model")
            return BuiltCandidate(written)
        if candidate.precision is Precision.INT4:
            share, counts = int4.matmul_weight_share(model, plan)
            if share < 0.5:  # int4 is weight-only on MatMul/Gemm: on a CNN it would be float under another name
                raise QuantizationError(f"{candidate.name}: int4 would cover {share:.1%} of the weights (MatMul/Gemm); the rest "
                                        f"({', '.join(f'{n} {op}' for op, (n, _) in counts.items() if op not in ('MatMul', 'Gemm'))}) stays float, "
                                        "so it is not offered as int4", hint="the int8 and FP32 candidates cover this model")
            return BuiltCandidate(int4.write_int4(model, out, plan))
        raise QuantizationError(f"the ONNX Runtime candidate builder cannot write {candidate.precision.value}", hint="use a backend that builds it")


def unquantized_nodes(path: Path, plan: QuantizationPlan) -> list[str]:
    """Nodes the static/mixed ``plan`` quantizes that are still float MatMul/Gemm/Conv in the written
    model: a static node whose inputs come from no DequantizeLinear, or a dynamic node left as it was.
    An excluded stem that :func:`layout.stem_channels_last` rewrote stays float on purpose."""
    import onnx

    nodes = onnx.load(str(path), load_external_data=False).graph.node
    dequantized = {node.output[0] for node in nodes if node.op_type == "DequantizeLinear"}
    skipped = set(plan.excluded)
    missed = []
    dynamic_nodes = set(plan.dynamic_nodes)
    for node in nodes:
        if node.name in skipped or node.op_type not in plan.op_types or layout.rewritten_from(node.name, skipped) or gemm_split_from(node.name, skipped):
            continue
        if node.name in dynamic_nodes or (node.op_type in INT8_OP_TYPES and not any(name in dequantized for name in node.input)):
            missed.append(node.name)
    return missed


def gemm_split_from(node_name: str, originals: set[str]) -> str | None:
    """The excluded Gemm that ONNX Runtime's dynamic quantizer (run for embedding tables and dynamic nodes) split into
    ``<name>_MatMul`` + ``<name>_Add``: it stays float as its plan says."""
    original = node_name[: -len("_MatMul")] if node_name.endswith("_MatMul") else None
    return original if original in originals else None


def _int8_only(plan: QuantizationPlan) -> QuantizationPlan:
    """The plan restricted to the op types static QDQ quantizes (fused ops run dynamic int8)."""
    return replace(plan, op_types=tuple(op for op in plan.op_types if op in INT8_OP_TYPES))
