"""ONNX Runtime (host CPU) implementations of what :func:`edgekit.quantize.auto.search_auto` plugs in:
a candidate builder (graph variants, calibration once per variant, the ``ort_writers``), an interleaved
timer, a metric evaluator, and :func:`plan_auto_onnxruntime`, which runs sensitivity analysis and the
search end to end.

Graph variants: ``exported`` (the FP32 export after ONNX Runtime's quantization pre-processing) and
``transformer-fusion``: ONNX Runtime's transformer optimizer (``model_type="bert"``), which fuses
attention into one ``Attention`` op, bias+GELU into ``BiasGelu`` and residual+LayerNorm into
``SkipLayerNormalization``. Fused graphs use ONNX Runtime contrib ops, so the variant is for ONNX
Runtime CPU targets only; ``Attention`` is quantized dynamically (``QAttention``), its MatMuls statically.

Two more candidates, each on its own graph: ``fp32-rewritten`` (graph ``float-rewrites``) is the FP32
model after pre-processing and edgekit's exact float rewrites (:mod:`edgekit.quantize.cnn_folding`: affine
folds, the HardSwish expansion), which alone can beat the original FP32 (PP-OCR's classifier: 0.76x)
when int8 loses; ``int8-ort-default`` (graph ``ort-default``) is what ONNX Runtime's own
``quantize_static`` writes with its defaults (QDQ, per-channel int8 weights, uint8 activations, MinMax,
every op type it quantizes) on the pre-processed graph, so that where ONNX Runtime's plain recipe is the
faster one on this instruction set, ``auto`` finds it too and the manifest says which plan won.
"""

from __future__ import annotations

import logging
import re
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.engines.fusion import transformer_fusion
from edgekit.engines.ort_session import cpu_session
from edgekit.errors import QuantizationError
from edgekit.precision import Backend, Precision
from edgekit.quantize import channel_spread, cnn_folding, edge_layers, ort_default_ranges, ort_layout, ort_writers, thin_convs
from edgekit.quantize.auto import AutoResult, search_auto
from edgekit.quantize.calibration import CalibrationCache, CalibrationError, CalibratorSpec, TensorRange, calibrate
from edgekit.quantize.calibration.from_recipe import calibrator_spec
from edgekit.quantize.candidates import EXPORTED, FLOAT, BuiltCandidate, Candidate, CandidateLadder, auto_candidates, fallback_candidates
from edgekit.quantize.judging import EvaluateFn, TimeFn
from edgekit.quantize.node_groups import find_node_groups
from edgekit.quantize.plan import INT8_OP_TYPES, QuantizationPlan, make_plan
from edgekit.quantize.sensitivity import QUANTIZED_INPUTS, Metric, QuantizationSimulator, SensitivityReport, rank_groups
from edgekit.recipe import AccuracyBudget, QuantizationSpec
from edgekit.target import TargetProfile

log = logging.getLogger(__name__)

TRANSFORMER_FUSION = "transformer-fusion"
#: The FP32 graph after pre-processing and the exact float rewrites (the graph static int8 starts from).
FLOAT_REWRITES = "float-rewrites"
#: The pre-processed FP32 graph, quantized by ONNX Runtime's quantize_static with its defaults.
ORT_DEFAULT = "ort-default"
FP32_REWRITTEN = "fp32-rewritten"
INT8_ORT_DEFAULT = "int8-ort-default"
#: ``--precision auto`` keeps the whole build within this multiple of a plain int8 build, estimated as the
#: pipeline's stages before the search plus the search's first candidate (the plain static int8 plan) built and
#: evaluated, its timing left out (:meth:`edgekit.quantize.pricing.TimeBudget.search_budget`). 2.5, not the 3x that
#: issue 17 allows: the estimate is off by the host's noise (shared 2-core host: the same build 1.3x apart).
AUTO_TIME_BUDGET_MULTIPLE = 2.5


# ---------------------------------------------------------------- builder


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
                pre = ort_writers.preprocess(self.fp32_path, self.work_dir / "fp32-exported.onnx")
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
        needed = [tensor for tensor in ort_writers.calibration_tensors(model, _int8_only(plan)) if tensor not in have]
        if needed:
            ort_default = self.collect_ort_default and self.ort_default_ranges is None and model == self._graphs.get(ORT_DEFAULT)
            also = ort_default_ranges.minmax_tensors(model) if ort_default else []
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
        return replace(built, path=ort_writers.without_shape_annotations(built.path, out))

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
                written = ort_default_ranges.write_with_ranges(model, out, self.ort_default_ranges)
            else:
                written = write_ort_default_static(model, out, self.calibration_batches)
            if not ort_writers.quantized_ops(written):
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
            return BuiltCandidate(ort_writers._save(converted, out))
        if plan is None:
            raise QuantizationError(f"candidate {candidate.name} ({candidate.precision.value}) has no quantization plan")
        if candidate.precision is Precision.INT8:
            ranges = self.ranges(candidate.graph, plan)
            ort_writers.write_static_qdq(model, out, plan, ranges)  # type: ignore[arg-type]  # TensorRange has min/max
            if not ort_writers.quantized_ops(out):
                raise QuantizationError(f"{candidate.name}: the plan quantized nothing (no Q/DQ or integer op written), so it is not an int8 plan",
                                        hint="every quantizable node is kept in higher precision; the FP32 candidate covers this")
            missed = unquantized_nodes(out, plan)
            if missed:
                raise QuantizationError(
                    f"{candidate.name}: the writers left {len(missed)} node(s) the plan quantizes in float: {', '.join(missed[:5])}",
                    hint="the graph changed under quantization (a node was renamed or split); exclude these nodes explicitly",
                )
            used = {name: ranges[name] for name in ort_writers.calibration_tensors(model, _int8_only(plan))}
            return BuiltCandidate(out, used)
        if candidate.precision is Precision.INT8_DYNAMIC:
            written = ort_writers.write_dynamic(model, out, plan)
            coverage = ort_writers.dynamic_coverage_note(model, plan)
            if not ort_writers.quantized_ops(written):
                raise QuantizationError(f"{candidate.name}: int8-dynamic quantized nothing in this graph, so it is not an int8-dynamic plan",
                                        hint=coverage or "the graph has no MatMul/Gemm weights")
            if coverage:  # PP-OCR's classifier: 0.3 % of its weights int8, chosen as 'int8-dynamic' for the float rewrites' speed
                raise QuantizationError(f"{candidate.name}: {coverage}; a plan that leaves most weights float is not offered as int8-dynamic",
                                        hint="the int8 and FP32 candidates cover this model")
            return BuiltCandidate(written)
        if candidate.precision is Precision.INT4:
            counts = ort_writers.weight_elements_by_op(model, tuple(plan.excluded))
            total = sum(elements for _, elements in counts.values())
            share = sum(counts.get(op, (0, 0))[1] for op in ("MatMul", "Gemm")) / total if total else 0.0
            if share < 0.5:  # int4 is weight-only on MatMul/Gemm: on a CNN it would be float under another name
                raise QuantizationError(f"{candidate.name}: int4 would cover {share:.1%} of the weights (MatMul/Gemm); the rest "
                                        f"({', '.join(f'{n} {op}' for op, (n, _) in counts.items() if op not in ('MatMul', 'Gemm'))}) stays float, "
                                        "so it is not offered as int4", hint="the int8 and FP32 candidates cover this model")
            return BuiltCandidate(ort_writers.write_int4(model, out, plan))
        raise QuantizationError(f"the ONNX Runtime candidate builder cannot write {candidate.precision.value}", hint="use a backend that builds it")


def write_ort_default_static(model_path: Path, out_path: Path, batches: Sequence[Mapping[str, np.ndarray]]) -> Path:
    """ONNX Runtime's ``quantize_static`` with its defaults (QDQ, per-channel int8 weights, uint8
    activations, MinMax over ``batches``, every op type its QDQ registry quantizes): the plain recipe a
    user would run, as an ``auto`` candidate."""
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

    names = {i.name for i in ort_session(model_path).get_inputs()}
    feeds = [{k: np.asarray(v) for k, v in batch.items() if k in names} for batch in batches]
    if not feeds:
        raise QuantizationError("int8-ort-default needs calibration batches", hint="add data.calibration to the recipe")

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.batches = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    try:
        quantize_static(str(model_path), str(out_path), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax)
    except Exception as exc:
        raise QuantizationError(f"ONNX Runtime's quantize_static failed on {model_path}: {type(exc).__name__}: {exc}",
                                hint="the edgekit int8 and FP32 candidates cover this model") from exc
    return out_path


def ort_default_plan(plan: QuantizationPlan) -> QuantizationPlan:
    """What :func:`write_ort_default_static` writes, as a plan for the manifest."""
    from onnxruntime.quantization.registry import QDQRegistry

    return replace(plan, activation_type="uint8", activation_symmetric=False, weight_type="int8", per_channel=True, calibrator="minmax",
                   op_types=tuple(sorted(QDQRegistry)), excluded={}, dynamic_nodes=(), float_outputs=(), float_consumers_skip_qdq=False,
                   channels_last_flatten=False, channels_last_stem=False, reduce_range=False,
                   notes=("written by onnxruntime.quantization.quantize_static with its defaults: QDQ, per-channel int8 weights, "
                          "uint8 activations, MinMax calibration, every op type in its QDQ registry",))


def unquantized_nodes(path: Path, plan: QuantizationPlan) -> list[str]:
    """Nodes the static/mixed ``plan`` quantizes that are still float MatMul/Gemm/Conv in the written
    model: a static node whose inputs come from no DequantizeLinear, or a dynamic node left as it was.
    An excluded stem that :func:`ort_layout.stem_channels_last` rewrote stays float on purpose."""
    import onnx

    nodes = onnx.load(str(path), load_external_data=False).graph.node
    dequantized = {node.output[0] for node in nodes if node.op_type == "DequantizeLinear"}
    skipped = set(plan.excluded)
    missed = []
    dynamic = set(plan.dynamic_nodes)
    for node in nodes:
        if node.name in skipped or node.op_type not in plan.op_types or ort_layout.rewritten_from(node.name, skipped):
            continue
        if node.name in dynamic or (node.op_type in INT8_OP_TYPES and not any(name in dequantized for name in node.input)):
            missed.append(node.name)
    return missed


def _int8_only(plan: QuantizationPlan) -> QuantizationPlan:
    """The plan restricted to the op types static QDQ quantizes (fused ops run dynamic int8)."""
    return replace(plan, op_types=tuple(op for op in plan.op_types if op in INT8_OP_TYPES))


# ---------------------------------------------------------------- timing and evaluation


class OrtInterleavedTimer:
    """``time_models`` for the search: each round runs every model once on ``feeds``; returns the median
    wall-clock latency in ms per model. Sessions of ``keep_loaded`` paths (the references) are reused.

    With ``bar`` (a latency ratio of the last model to the first), timing stops after ``min_rounds`` once
    the candidate is decisively over it (:meth:`_decisively_over`): it is rejected anyway."""

    def __init__(self, feeds: Mapping[str, np.ndarray], *, threads: int | None = None, rounds: int = 11, warmup: int = 2,
                 min_seconds: float = 0.1, max_rounds: int = 200, graph_optimization: str = "all", keep_loaded: Sequence[Path] = (),
                 min_rounds: int = 5, stop_margin: float = 0.15) -> None:
        if rounds < 1 or max_rounds < rounds:
            raise QuantizationError(f"the timer needs 1 <= rounds <= max_rounds, got rounds={rounds}, max_rounds={max_rounds}")
        self.feeds = dict(feeds)
        self.threads, self.rounds, self.warmup, self.graph_optimization = threads, rounds, warmup, graph_optimization
        self.min_seconds, self.max_rounds = min_seconds, max_rounds
        self.keep_loaded = {Path(p).resolve() for p in keep_loaded}
        self.min_rounds, self.stop_margin = min_rounds, stop_margin
        self._sessions: dict[Path, Any] = {}
        self.stopped_early = 0

    def __call__(self, paths: Sequence[Path], bar: float | None = None) -> list[float]:
        sessions = [self._session(Path(path)) for path in paths]
        runs = [(session, {i.name: self.feeds[i.name] for i in session.get_inputs()}) for session in sessions]
        start = time.perf_counter()
        for _ in range(max(self.warmup, 1)):
            for session, feed in runs:
                session.run(None, feed)
        # Fast models get more rounds (at least ``min_seconds`` of timing per model), so that a few
        # scheduler hiccups on a shared machine do not move the median.
        per_round_s = (time.perf_counter() - start) / max(self.warmup, 1) / max(len(runs), 1)
        rounds = min(self.max_rounds, max(self.rounds, int(self.min_seconds / max(per_round_s, 1e-6))))
        samples: list[list[float]] = [[] for _ in runs]
        for done in range(1, rounds + 1):
            for index, (session, feed) in enumerate(runs):
                start = time.perf_counter()
                session.run(None, feed)
                samples[index].append((time.perf_counter() - start) * 1000.0)
            if bar is not None and len(runs) > 1 and done >= self.min_rounds and done < rounds and self._decisively_over(samples, bar):
                self.stopped_early += 1
                break
        return [statistics.median(values) for values in samples]

    def _decisively_over(self, samples: Sequence[Sequence[float]], bar: float) -> bool:
        """The last model is rejected whatever more rounds would say: its median per-round ratio to the first is
        over ``bar * (1 + stop_margin)``, or, after twice ``min_rounds``, three rounds in four are over ``bar``
        (SegFormer's fused int8 at 1.09x FP32 against the FP32 bar ran 66 rounds of 3 models before)."""
        ratios = sorted(last / first for first, last in zip(samples[0], samples[-1]))
        if statistics.median(ratios) > bar * (1 + self.stop_margin):
            return True
        return len(ratios) >= 2 * self.min_rounds and ratios[len(ratios) // 4] > bar

    def _session(self, path: Path) -> Any:
        resolved = path.resolve()
        if resolved in self._sessions:
            return self._sessions[resolved]
        session = shared_session(path, self.threads, self.graph_optimization)
        if resolved in self.keep_loaded:
            self._sessions[resolved] = session
        return session


#: The last few sessions the evaluator and the timer created, so a candidate is loaded (and optimised by
#: ONNX Runtime) once for both: key (path, size, mtime, threads, optimisation level).
_SESSIONS: dict[tuple[Any, ...], Any] = {}
_SESSIONS_KEPT = 3


def shared_session(path: Path, threads: int | None = None, graph_optimization: str = "all") -> Any:
    """:func:`ort_session`, reused while the file is unchanged (the candidate just built, evaluated then timed)."""
    stat = Path(path).stat()
    key = (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns, threads, graph_optimization)
    if key in _SESSIONS:
        _SESSIONS[key] = _SESSIONS.pop(key)
        return _SESSIONS[key]
    session = ort_session(path, threads, graph_optimization)
    _SESSIONS[key] = session
    while len(_SESSIONS) > _SESSIONS_KEPT:
        _SESSIONS.pop(next(iter(_SESSIONS)))
    return session


def ort_session(path: Path, threads: int | None = None, graph_optimization: str = "all") -> Any:
    """:func:`~edgekit.engines.ort_session.cpu_session` of a candidate, denormals flushed as CPU bundles run, and its
    intra-op threads parked after each run: the timer runs candidates back to back, and a pool left spinning takes a
    core from the next session (2 cores: YOLOS int8-dynamic timed 0.85x..1.3x FP32 by turns, wav2vec2's rewritten
    FP32 0.22x). A graph ONNX Runtime cannot load is a QuantizationError."""
    try:
        return cpu_session(path, threads, graph_optimization=graph_optimization, allow_spinning=False)
    except Exception as exc:
        raise QuantizationError(f"ONNX Runtime cannot load {path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


@dataclass(frozen=True)
class MetricResult:
    value: float
    passed: bool
    reference: float
    cosine_min: float | None
    reasons: tuple[str, ...] = ()


class OrtMetricEvaluator:
    """``evaluate`` for the search: the metric over ``batches`` against FP32 reference outputs, checked
    against an :class:`AccuracyBudget` (and, optionally, a floor on the per-row cosine minimum)."""

    def __init__(self, batches: Sequence[Mapping[str, np.ndarray]], metric: Metric, budget: AccuracyBudget, reference_path: Path, *,
                 output: str | None = None, label_key: str | None = "labels", higher_is_better: bool = True, min_cosine: float | None = None,
                 threads: int | None = None) -> None:
        self.batches = [dict(batch) for batch in batches]
        self.metric, self.budget, self.output = metric, budget, output
        self.labels = [np.asarray(b[label_key]) if label_key and label_key in b else None for b in self.batches]
        self.higher_is_better, self.min_cosine, self.threads = higher_is_better, min_cosine, threads
        self.reference_outputs = self.outputs(Path(reference_path))
        self.reference_value = float(metric(self.reference_outputs, self.reference_outputs, self.labels))

    def outputs(self, path: Path) -> list[np.ndarray]:
        session = shared_session(path, self.threads)
        names = [o.name for o in session.get_outputs()]
        if self.output is not None and self.output not in names:
            raise QuantizationError(f"{path}: no output '{self.output}'", hint=f"its outputs: {', '.join(names)}")
        index = names.index(self.output) if self.output else 0
        inputs = [i.name for i in session.get_inputs()]
        return [session.run(None, {name: batch[name] for name in inputs})[index] for batch in self.batches]

    def __call__(self, path: Path) -> MetricResult:
        from edgekit.evaluate.metrics import cosine_min

        got = self.outputs(path)
        value = float(self.metric(got, self.reference_outputs, self.labels))
        cos_min = cosine_min(got, self.reference_outputs) if got and got[0].dtype.kind == "f" else None
        drop = (self.reference_value - value) if self.higher_is_better else (value - self.reference_value)
        reasons = []
        if self.budget.max_drop is not None and drop > self.budget.max_drop + 1e-12:
            reasons.append(f"drop {drop:.6g} > max_drop {self.budget.max_drop}")
        if self.budget.min_value is not None and value < self.budget.min_value:
            reasons.append(f"{value:.6g} < min_value {self.budget.min_value}")
        if self.budget.max_value is not None and value > self.budget.max_value:
            reasons.append(f"{value:.6g} > max_value {self.budget.max_value}")
        if self.min_cosine is not None and cos_min is not None and cos_min < self.min_cosine:
            reasons.append(f"cosine min {cos_min:.6g} < {self.min_cosine}")
        return MetricResult(value, not reasons, self.reference_value, cos_min, tuple(reasons))


class RecipeEvaluator:
    """``evaluate`` for the search with whatever metric the recipe names (top1, cosine, mse, a task metric
    such as detection or ctc_text, or a callable): :func:`edgekit.evaluate.accuracy.evaluate_accuracy`,
    the function the build's own evaluation stage uses, against the FP32 model's outputs (run once)."""

    def __init__(self, recipe: Any, batches: Sequence[Mapping[str, np.ndarray]], reference_path: Path, *, threads: int | None = None) -> None:
        from edgekit.evaluate.accuracy import run_reference

        self.recipe, self.threads = recipe, threads
        self.batches = [dict(batch) for batch in batches]
        self.reference_outputs = run_reference(recipe, self._runner(Path(reference_path)), self.batches)

    def _runner(self, path: Path) -> Any:
        session = shared_session(path, self.threads)
        names = [o.name for o in session.get_outputs()]
        inputs = [i.name for i in session.get_inputs()]
        return lambda feeds: dict(zip(names, session.run(None, {name: feeds[name] for name in inputs})))

    def __call__(self, path: Path) -> Any:
        from edgekit.evaluate.accuracy import evaluate_accuracy

        return evaluate_accuracy(self.recipe, self._runner(Path(path)), self.reference_outputs, self.batches, "onnxruntime-fp32")


def recipe_metric_spec(recipe: Any) -> MetricSpec:
    """The metric the sensitivity ranking uses: the recipe's own when it reads one output array (top1,
    cosine, mse), otherwise (task and callable metrics, which read every output) cosine to FP32 on the
    evaluated output, as a proxy that only orders node groups; candidates are judged by the recipe's metric."""
    from edgekit.evaluate.metrics import METRICS

    spec = recipe.evaluation
    output = spec.output or recipe.outputs[0]
    if spec.metric in METRICS:
        return MetricSpec(METRICS[spec.metric], spec.metric, spec.better_is_higher, output, spec.labels)
    return MetricSpec(METRICS["cosine"], f"cosine (sensitivity proxy for {spec.metric})", True, output, None)


# ---------------------------------------------------------------- end to end


@dataclass(frozen=True)
class MetricSpec:
    metric: Metric
    name: str
    higher_is_better: bool = True
    output: str | None = None
    label_key: str | None = "labels"


def auto_base_plan(spec: QuantizationSpec, target: TargetProfile, backend: Backend, model_path: Path) -> QuantizationPlan:
    """The static int8 plan the search starts from: the same graph-aware plan ``--precision int8`` builds
    (:func:`ort_writers.static_int8_plan`)."""
    return ort_writers.static_int8_plan(make_plan(spec, target, backend, Precision.INT8), model_path)


def auto_calibrators(spec: QuantizationSpec, plan: QuantizationPlan) -> dict[str, CalibratorSpec]:
    """Calibrators ``--precision auto`` compares: only the recipe's when it names one explicitly,
    otherwise the default (percentile) and minmax. Entropy is not tried by default: it calibrates
    slowest and clipped MiniLM's outlier channels as badly as percentile."""
    names = [spec.calibrator] if "calibrator" in spec.model_fields_set else list(dict.fromkeys([spec.calibrator, "minmax"]))
    return {name: calibrator_spec(spec.model_copy(update={"calibrator": name}), plan) for name in names}


def plan_auto_onnxruntime(
    fp32_path: Path,
    work_dir: Path,
    *,
    spec: QuantizationSpec,
    target: TargetProfile,
    backend: Backend,
    supported: Sequence[Precision],
    calibration_batches: Sequence[Mapping[str, np.ndarray]],
    evaluation_batches: Sequence[Mapping[str, np.ndarray]],
    metric: MetricSpec,
    evaluate: EvaluateFn,
    time_models: TimeFn,
    calibrators: Mapping[str, CalibratorSpec] | None = None,
    cache: CalibrationCache | None = None,
    graphs: Sequence[str] = (TRANSFORMER_FUSION, EXPORTED),
    sensitivity_batches: int = 4,
    noise_margin: float = 0.05,
    budget_text: str = "the recipe's evaluation.budget",
    threads: int | None = None,
    time_budget_s: float | None = None,
    bench_feeds: Mapping[str, np.ndarray] | None = None,
    time_budget_multiple: float | None = AUTO_TIME_BUDGET_MULTIPLE,
    fixed_s: float = 0.0,
) -> AutoResult:
    """End to end on ONNX Runtime: list candidates for each graph variant that applies (fused variants
    first: expected faster), and run :func:`search_auto` with ``evaluate`` and ``time_models``.
    ``supported`` is :func:`gating.supported_precisions` for the target.

    Decisive: one calibrator (the recipe's, as ``--precision int8`` uses; ONNX Runtime's plain MinMax
    recipe is its own candidate, ``int8-ort-default``), one calibration per graph variant for every
    candidate, and one sensitivity ranking (on the exported graph) for every ladder, run only when a
    ladder is tried, i.e. when static int8 fails the budget while faster than the bar. The float-rewrite
    FP32 candidate comes right after static int8, ONNX Runtime's default plan after int8-dynamic, so that their latency
    prunes what follows. int8-dynamic and int4 touch only MatMul/Gemm: when those do under
    ``MATMUL_WORK_FLOOR`` of the graph's work (at ``bench_feeds``' shapes), they are skipped.
    ``time_budget_multiple``: the build stays within that multiple of a plain int8 build (estimated from
    ``fixed_s``, the seconds the build spent before this call, and the first candidate, the plain static int8
    plan, built and evaluated); ``time_budget_s`` caps the whole call."""
    started = time.perf_counter()
    exported_plan = make_plan(spec, target, backend, Precision.INT8)
    calibrators = dict(calibrators or auto_calibrators(spec, exported_plan))
    builder = OrtCandidateBuilder(fp32_path, work_dir, calibration_batches, calibrators, cache)
    builder.collect_ort_default = True
    exported = builder.graph_model(EXPORTED) or Path(fp32_path)
    base = replace(auto_base_plan(spec, target, backend, exported), calibrator=next(iter(calibrators)))
    base = channel_spread.keep_wide_spread_convs_float(exported, base, calibration_batches)
    notes: tuple[str, ...] = (f"calibrator {base.calibrator} (one calibration shared by every candidate of a graph)",)
    ranked: list[SensitivityReport] = []

    def sensitivity() -> SensitivityReport:  # once, on demand, for every ladder of every graph variant
        if not ranked:
            simulator = QuantizationSimulator(exported, base, builder.ranges(EXPORTED, base), evaluation_batches, output=metric.output,
                                              label_key=metric.label_key, max_batches=sensitivity_batches, threads=threads)
            simulator.use_batches(max(1, min(simulator.batches, SENSITIVITY_RUN_BATCHES // (len(simulator.groups) + 2))))
            ranked.append(rank_groups(simulator, metric.metric, metric_name=metric.name, higher_is_better=metric.higher_is_better))
        return ranked[0]

    group_counts: list[int] = []

    def analysis_runs() -> float:  # what sensitivity() takes, in evaluation batches' worth: 0 once it ran
        if ranked:
            return 0
        if not group_counts:
            static_types = tuple(op for op in base.op_types if op in QUANTIZED_INPUTS)
            group_counts.append(len(find_node_groups(exported, static_types, exclude=[*base.excluded, *base.dynamic_nodes])))
        return SWITCH_MODEL_RUN_COST * sensitivity_analysis_runs(group_counts[0], min(sensitivity_batches, len(evaluation_batches)))

    matmul_share = matmul_work_share(exported, bench_feeds)
    bound: dict[str, Any] = {}
    if matmul_share is not None and matmul_share < MATMUL_WORK_FLOOR:
        bound = {"not_worth": f"MatMul/Gemm do {matmul_share:.1%} of the work at the benchmark shape and it quantizes only those: "
                              "the graph would stay essentially float (at most a no-op plan)"}
        notes += (f"MatMul/Gemm do {matmul_share:.1%} of the exported graph's work: int8-dynamic and int4 (MatMul/Gemm only) are not tried",)
    candidates: list[Candidate | CandidateLadder] = []
    references: dict[str, Path] = {}
    dynamic_plan = make_plan(spec, target, backend, Precision.INT8_DYNAMIC) if Precision.INT8_DYNAMIC in supported else None
    int4_plan = make_plan(spec, target, backend, Precision.INT4) if Precision.INT4 in supported else None
    for graph in graphs:
        if graph != EXPORTED and not (backend is Backend.ONNXRUNTIME and _cpu_first(target, backend)):
            continue
        model = builder.graph_model(graph)
        if model is None:
            notes += (f"graph variant {graph} does not apply (no attention block recognised)",)
            continue
        plan = base if graph == EXPORTED else replace(base, float_outputs=ort_writers.float_output_op_types(model, base.op_types))
        groups = find_node_groups(model, plan.op_types, exclude=plan.excluded)
        dynamic_only = {} if graph == EXPORTED else _fused_dynamic_nodes(model)
        listed = auto_candidates(plan, groups, sensitivity, supported, max_kept=spec.auto_max_excluded, graph=graph,
                                 dynamic_only=dynamic_only, dynamic_plan=dynamic_plan, int4_plan=int4_plan, include_fallbacks=False)
        candidates += [_priced(_bounded(item, bound), analysis_runs) for item in listed]
        if graph != EXPORTED:
            references[graph] = model
            notes += (f"graph variant {graph}: fused {builder.fusion_stats}",)
    candidates += [_bounded(item, bound) for item in fallback_candidates(supported, int4_plan)]
    candidates = _with_plain_candidates(candidates, base, supported, convolutional=bool(bound))
    if backend is Backend.ONNXRUNTIME and _cpu_first(target, backend):  # its case is ONNX Runtime's CPU kernels (NCHWc float Conv)
        candidates = _with_thin_conv_candidates(candidates, base, exported)
    candidates = _with_edge_candidates(candidates, exported)
    result = search_auto(candidates, build=builder, evaluate=evaluate, time_models=time_models, reference=Path(fp32_path),
                         graph_references=references, sensitivity=None, noise_margin=noise_margin,
                         higher_is_better=metric.higher_is_better, metric_name=metric.name, budget_text=budget_text, notes=notes,
                         time_budget_s=time_budget_s, started=started, time_budget_multiple=time_budget_multiple,
                         fixed_s=fixed_s, evaluation_batches=len(evaluation_batches))
    report = ranked[0] if ranked else None
    if result.chosen.name == FP32_REWRITTEN:
        counts = builder.fold_counts.note() if builder.fold_counts is not None else None
        notes += (f"fp32 (rewritten): the FP32 model after ONNX Runtime's quantization pre-processing"
                  f"{' and ' + counts if counts else ''}; no quantized op",)
    elif result.chosen.name == INT8_ORT_DEFAULT:
        notes += ("int8 (ONNX Runtime quantize_static defaults) was the fastest plan inside the budget on this host",)
    if report is None:
        notes += ("sensitivity analysis not run: no ladder was tried (static int8 passed, was not faster than the bar, or could not be built)",)
    stats = {**result.stats, "calibration_passes": builder.calibration_passes, "calibration_cache_hits": builder.calibration_cache_hits,
             "sensitivity_runs": len(ranked), "sensitivity_seconds": round(report.seconds, 2) if report else 0.0,
             "timing_stopped_early": getattr(time_models, "stopped_early", 0)}
    return replace(result, sensitivity=report, notes=notes, stats=stats)


def _with_plain_candidates(listed: list[Candidate | CandidateLadder], base: QuantizationPlan,
                           supported: Sequence[Precision], convolutional: bool = False) -> list[Candidate | CandidateLadder]:
    """``listed`` with the float-rewrite FP32 candidate right after the first static int8 candidate of any
    graph variant, and ONNX Runtime's default static plan after that graph's int8-dynamic (so that their
    latency is a bar early, and the time budget, scaled from the first candidate, leaves them room). The
    cheap ones first: fp32-rewritten needs no calibration (wav2vec2: 0.96x FP32, the only plan faster than
    FP32 inside its budget), int8-dynamic neither (YOLOS: 0.84x); ONNX Runtime's default plan lost on every
    small transformer here (1.27-1.55x FP32). On a ``convolutional`` graph (MatMul/Gemm under
    :data:`MATMUL_WORK_FLOOR` of the work: int8-dynamic and int4 are not tried) that plan comes right after
    static int8 instead: it is the strongest plain plan there (ResNet: 0.45-0.52x FP32 inside the budget, where
    edgekit's static int8 missed it by one image) and, its ranges collected in the shared calibration, costs a
    write, an evaluation and a timing; behind the cheaper candidates, ResNet's sub-second budget ran out first."""
    at = next((i + 1 for i, item in enumerate(listed) if isinstance(item, Candidate) and item.precision is Precision.INT8), 0)
    ort_default = Candidate(INT8_ORT_DEFAULT, Precision.INT8, ort_default_plan(base), ORT_DEFAULT)
    if convolutional and at and Precision.INT8 in supported:
        return [*listed[:at], ort_default, Candidate(FP32_REWRITTEN, Precision.FP32, None, FLOAT_REWRITES), *listed[at:]]
    out = [*listed[:at], Candidate(FP32_REWRITTEN, Precision.FP32, None, FLOAT_REWRITES), *listed[at:]]
    if Precision.INT8 in supported:
        at += 1
        if at and at < len(out) and isinstance(out[at], Candidate) and out[at].precision is Precision.INT8_DYNAMIC:
            at += 1
        out.insert(at, ort_default)
    return out


def _with_thin_conv_candidates(listed: list[Candidate | CandidateLadder], base: QuantizationPlan,
                               exported: Path) -> list[Candidate | CandidateLadder]:
    """``listed`` with :mod:`edgekit.quantize.thin_convs`' plans (a separable CNN's convolutions under each of
    its thresholds of multiply-adds per output element, and its HardSigmoid-gated Muls, float) right after the
    float-rewrite FP32 candidate, when ``listed`` has a static int8 candidate on the exported graph. They reuse
    its calibration, so they are priced as cheap candidates; PaddleClas' orientation classifier, in the
    corpus: chosen at 0.65x FP32 (top-1 1.0) where static int8 ran 1.01x with top-1 0.979."""
    if not any(isinstance(item, Candidate) and item.precision is Precision.INT8 and item.graph == EXPORTED for item in listed):
        return listed
    added: list[Candidate] = []
    for min_macs in thin_convs.THRESHOLDS:
        plan = thin_convs.keep_thin_convs_float(exported, base, min_macs)
        if plan is base or any(plan.excluded == other.plan.excluded for other in added if other.plan is not None):
            continue
        kept = {name: why for name, why in plan.excluded.items() if name not in base.excluded}
        added.append(Candidate(thin_convs.candidate_name(min_macs), Precision.INT8, plan, EXPORTED, kept))
    at = next((i + 1 for i, item in enumerate(listed) if isinstance(item, Candidate) and item.name == FP32_REWRITTEN), len(listed))
    return [*listed[:at], *added, *listed[at:]]


def _with_edge_candidates(listed: list[Candidate | CandidateLadder], exported: Path) -> list[Candidate | CandidateLadder]:
    """``listed`` with :mod:`edgekit.quantize.edge_layers`' plan (the quantizable layers nearest the inputs and the
    outputs float) for the exported graph's static int8 and int8-dynamic candidates, each right after its base (the
    static one after the float-rewrite and thin-conv candidates that follow it), before the sensitivity ladders: it
    reuses its base's calibration and needs no sensitivity analysis, so it is priced as a cheap candidate. It runs
    every node at its base's precision or higher, so it is skipped unbuilt when its base passed or was not faster
    than the bar. wav2vec2's int8-dynamic kept 0.75 of the CTC lines (budget 0.8); with its feature projection and
    CTC head float (depth 1), 0.98 at 0.92x FP32."""
    out = list(listed)
    for base_name in ("int8-static", "int8-dynamic"):
        at = next((i for i, item in enumerate(out) if isinstance(item, Candidate) and item.name == base_name and item.graph == EXPORTED), -1)
        base = out[at] if at >= 0 else None
        if not isinstance(base, Candidate) or base.plan is None or not base.levels:
            continue
        plan = edge_layers.keep_edges_float(exported, base.plan, edge_layers.DEPTH)
        if plan is base.plan:
            continue
        kept = {name: why for name, why in plan.excluded.items() if name not in base.plan.excluded}
        levels = {**base.levels, **{name: FLOAT for name in kept}}
        edge = replace(base, name=edge_layers.candidate_name(base_name, edge_layers.DEPTH), plan=plan, kept={**base.kept, **kept}, levels=levels)
        at += 1
        while at < len(out) and isinstance(out[at], Candidate) and (out[at].name == FP32_REWRITTEN or out[at].name.startswith("int8-thin-convs")):
            at += 1
        out.insert(at, edge)
    return out


#: Sensitivity analysis runs the switch model once per group (plus two) on each batch; past this many
#: batch-runs it uses fewer batches (at least one): PP-OCR's detector, 62 groups x 4 batches, took 105 s.
SENSITIVITY_RUN_BATCHES = 128
#: int8-dynamic and int4 quantize only MatMul/Gemm; under this share of the work they are not tried.
MATMUL_WORK_FLOOR = 0.05


def matmul_work_share(model_path: Path, feeds: Mapping[str, np.ndarray] | None) -> float | None:
    """The share of the graph's arithmetic (FLOPs at the shapes of ``feeds``) done by MatMul/Gemm
    (``None`` when it cannot be worked out)."""
    from edgekit.estimate.graph_cost import graph_costs

    try:
        cost = graph_costs(model_path, input_shapes={k: tuple(v.shape) for k, v in feeds.items()} if feeds else None)
    except Exception as exc:  # an estimate only prunes; the search goes on without it
        log.info("no work estimate for %s (%s): int8-dynamic and int4 are tried", model_path, type(exc).__name__)
        return None
    total = cost.total_ops
    if not total > 0:
        return None
    return sum(node.ops for node in cost.nodes if node.op_type in ("MatMul", "Gemm")) / total


#: One run of the sensitivity switch model on a batch, in evaluations of a candidate on a batch: the switch model
#: is the float graph with a Where between float and quantize-dequantized values for every group, and building it
#: and its session comes on top. YOLOv8n (57 groups, 4 + 59 x 2 = 122 runs): 6.65 s and 19.6 s in two corpus runs
#: where the first candidate's evaluation took 0.3-0.4 s for 12 batches, i.e. 2.2x and 4.8x; 4 keeps the ladder
#: from overrunning the budget on the second.
SWITCH_MODEL_RUN_COST = 4.0


def sensitivity_analysis_runs(groups: int, batches: int) -> int:
    """Model runs (one batch each) of :func:`plan_auto_onnxruntime`'s sensitivity ranking of ``groups`` node groups
    on up to ``batches`` evaluation batches: the FP32 reference on every batch, then a run per group plus two on the
    batches :data:`SENSITIVITY_RUN_BATCHES` leaves."""
    if groups < 1 or batches < 1:
        return 0
    used = max(1, min(batches, SENSITIVITY_RUN_BATCHES // (groups + 2)))
    return batches + (groups + 2) * used


def _priced(item: Candidate | CandidateLadder, analysis_runs: Any) -> Candidate | CandidateLadder:
    """``item`` with ``analysis_runs`` (what its sensitivity ranking costs, in model runs) when it is a lazy ladder."""
    if isinstance(item, CandidateLadder) and item.expand is not None and not item.steps:
        return replace(item, analysis_runs=analysis_runs)
    return item


def _bounded(item: Candidate | CandidateLadder, bound: Mapping[str, Any]) -> Candidate | CandidateLadder:
    """``item`` with the static bound of MatMul/Gemm-only schemes (int8-dynamic, int4) when it is one."""
    if bound and isinstance(item, Candidate) and item.precision in (Precision.INT8_DYNAMIC, Precision.INT4):
        return replace(item, **bound)
    return item


def _fused_dynamic_nodes(model_path: Path) -> dict[str, str]:
    import onnx

    return {node.name: node.op_type for node in onnx.load(str(model_path), load_external_data=False).graph.node if node.op_type == "Attention"}


def _cpu_first(target: TargetProfile, backend: Backend) -> bool:
    providers = [ep.name for ep in target.backend(backend).execution_providers]
    return bool(providers) and providers[0] == "CPUExecutionProvider"
