"""One corpus model through every precision and target: edgekit builds (the pipeline, as a user runs it),
ONNX Runtime's own quantizers as the peers to beat, the model's task metric (its recipe's ``evaluation``)
against FP32, the golden self-check of every bundle, and latency timed interleaved on this host (every
variant gets a turn each round, in a shuffled order, so noise on a shared host hits all of them alike).

Only :data:`HOST_TARGET` runs here. Bundles for other targets (an aarch64 board, a Jetson whose TensorRT
engine is built on the device) are built, self-checked on ONNX Runtime's CPU provider and estimated with
``edgekit estimate`` instead of timed."""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from edgekit.corpus.base import Batch, CorpusModel
from edgekit.corpus.metrics import cosine, evaluation_spec, task_metric
from edgekit.corpus.recipes import write_recipe
from edgekit.engines.ort_session import cpu_session

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "int8", "int8-dynamic", "auto")
PEERS = ("ort-quantize_static", "ort-quantize_dynamic", "openvino-default", "openvino-f32", "openvino-nncf-int8")
#: The OpenVINO peers (``--openvino``): the source ONNX file compiled by OpenVINO's CPU plugin with its own default
#: precision (bf16 where the CPU has AVX-512 BF16 or AMX) and at strict f32; NNCF's int8 where edgekit has it.
OPENVINO_PEERS = ("openvino-default", "openvino-f32", "openvino-nncf-int8")
#: peer -> the INFERENCE_PRECISION_HINT it compiles with ("default": none, OpenVINO's own choice); NNCF's int8 QDQ graph
#: runs its float layers at strict f32, as an edgekit openvino int8 bundle does (edgekit.engines.openvino.PRECISION_HINTS)
OPENVINO_PEER_HINTS = {"openvino-default": "default", "openvino-f32": "f32", "openvino-nncf-int8": "f32"}
#: The graph a configuration runs (CorpusRow.config): the FP32 graph (the source ONNX file, or edgekit's FP32 export of it)
FP32_GRAPH = "fp32 graph"
TARGETS = ("x86-64-cpu", "raspberry-pi-5", "jetson-orin-nano-8gb")
#: The target this host runs and times; the others are built, self-checked and estimated.
HOST_TARGET = "x86-64-cpu"
#: Timed calls per variant in each round (after one untimed call).
CALLS_PER_ROUND = 3


@dataclass
class CorpusRow:
    model: str
    variant: str  # an edgekit precision, or a peer from PEERS
    target: str
    size_bytes: int | None = None
    build_s: float | None = None
    metric_name: str = ""
    metric: float | None = None
    min_value: float | None = None  # the task-metric budget (the recipe's evaluation.budget.min_value for auto)
    meets_budget: bool | None = None
    cosine: float | None = None
    p50_ms: float | None = None  # host target: median of every timed call
    p25_ms: float | None = None
    p75_ms: float | None = None
    round_ms: list[float] = field(default_factory=list)  # the median of each round, for per-round ratios
    x_fp32: float | None = None
    x_best_ort: float | None = None  # latency over the faster ONNX Runtime quantizer that meets the budget
    best_ort: str | None = None  # which one
    estimate_p50_ms: float | None = None  # other targets: edgekit estimate's p50
    estimate_engine: str | None = None
    model_sha256: str | None = None  # the bundle's model file (the manifest's model.sha256): tells an auto that returned FP32's own file
    golden: str | None = None  # "pass", "fail: ...", or why it could not run; None for peers (no bundle)
    chosen: str | None = None  # auto: the precision and plan it chose
    #: engine, precision and graph, for the verdict's same-configuration rule (summary.model_verdict): "openvino bf16 fp32
    #: graph" for auto's OpenVINO bf16 candidate and for the OpenVINO default peer on a bf16 host; None where no peer can share it
    config: str | None = None
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CorpusRow":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def _feeds(session: Any, batch: Batch) -> dict[str, np.ndarray]:
    names = {i.name for i in session.get_inputs()}
    return {k: v for k, v in batch.items() if k in names}


def _outputs(session: Any, batch: Batch) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, _feeds(session, batch))))


# ---------------------------------------------------------------- build times kept beside reused artifacts


def _sidecar(artifact: Path) -> Path:
    return artifact.with_name(artifact.name + ".build.json")


def _remember_build(artifact: Path, seconds: float) -> None:
    """The sidecar of a finished build: its time and, for a file, the file's size and sha256 (checked on reuse)."""
    record: dict[str, Any] = {"build_s": seconds}
    if artifact.is_file():
        record.update(size_bytes=artifact.stat().st_size, sha256=_sha256(artifact))
    _sidecar(artifact).write_text(json.dumps(record))


def _recalled_build(artifact: Path) -> float | None:
    """The build time of a finished build to reuse; None (build again) without a sidecar, or where the file is not the
    one the sidecar describes (a run killed while it rewrote the file, or a sidecar of an older corpus without them)."""
    try:
        record = json.loads(_sidecar(artifact).read_text())
        if artifact.is_file() and (record["size_bytes"] != artifact.stat().st_size or record["sha256"] != _sha256(artifact)):
            return None
        return float(record["build_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _forget_build(artifact: Path) -> None:
    """Before a rebuild: without its sidecar, a file left half-written by a killed run is never reused."""
    _sidecar(artifact).unlink(missing_ok=True)


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------- peers


def ort_peers(model: CorpusModel, work: Path, reuse: bool = False) -> list[CorpusRow]:
    """ONNX Runtime's quantize_static (QDQ, per-channel int8 weights, uint8 activations, MinMax on the
    corpus's calibration batches) and quantize_dynamic (per-channel int8), after its own pre-processing;
    one row each with the file in ``notes[0]`` (``path:...``), or the quantizer's error."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

    from edgekit.quantize.ort.graph_files import preprocess

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self, batches: list[Batch]) -> None:
            self.batches = iter(batches)

        def get_next(self) -> Batch | None:
            return next(self.batches, None)

    work.mkdir(parents=True, exist_ok=True)
    out = {"ort-quantize_static": work / "ort_static.onnx", "ort-quantize_dynamic": work / "ort_dynamic.onnx"}
    quantizers: dict[str, Callable[[Path, Path], None]] = {
        "ort-quantize_static": lambda pre, dst: quantize_static(
            str(pre), str(dst), Reader(model.calibration), quant_format=QuantFormat.QDQ, per_channel=True,
            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8),
        "ort-quantize_dynamic": lambda pre, dst: quantize_dynamic(str(pre), str(dst), per_channel=True, weight_type=QuantType.QInt8),
    }
    pre, pre_s = work / "pre.onnx", 0.0
    rows = []
    for name, quantize in quantizers.items():
        row = CorpusRow(model.name, name, HOST_TARGET)
        rows.append(row)
        recalled = _recalled_build(out[name]) if reuse and out[name].is_file() else None
        if recalled is not None:
            row.build_s, row.size_bytes = recalled, _size(out[name])
            row.notes.append("reused")
            continue
        _forget_build(out[name])
        partial = out[name].with_name(out[name].stem + ".partial.onnx")  # renamed once whole: a killed run leaves no half file
        start = time.perf_counter()
        try:
            if not pre_s:  # once, for both quantizers
                preprocess(model.onnx_path, pre)
                pre_s = time.perf_counter() - start
                start = time.perf_counter()
            quantize(pre, partial)
            partial.replace(out[name])
        except Exception as exc:  # the peer's own failure is a result, not a crash of the corpus
            partial.unlink(missing_ok=True)
            row.error = f"ONNX Runtime {name.removeprefix('ort-')} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            continue
        row.build_s = pre_s + time.perf_counter() - start  # each peer pays its pre-processing
        row.size_bytes = _size(out[name])
        _remember_build(out[name], row.build_s)
    return rows


def peer_path(work: Path, name: str) -> Path:
    return work / {"ort-quantize_static": "ort_static.onnx", "ort-quantize_dynamic": "ort_dynamic.onnx"}[name]


def openvino_peers(model: CorpusModel, work: Path, reuse: bool = False) -> tuple[list[CorpusRow], dict[str, Path]]:
    """OpenVINO's peers and the file each compiles. Default and strict f32 compile the source ONNX file (nothing to build;
    the compile is measured when timed); NNCF int8 is ``nncf.quantize`` of the source file on the corpus's calibration
    batches (edgekit.engines.openvino_nncf, NNCF's defaults for the CPU), written in ``work``."""
    from edgekit.engines.openvino_session import available, default_precision

    rows, paths = [], {}
    for name in OPENVINO_PEERS:
        row = CorpusRow(model.name, name, HOST_TARGET)
        rows.append(row)
        if not available():
            row.error = "not available: OpenVINO (edgekit[openvino]) is not installed here"
            continue
        hint = OPENVINO_PEER_HINTS[name]
        if name == "openvino-nncf-int8":
            paths[name] = path = work / "nncf_int8.onnx"
            row.config = NNCF_CONFIG
            row.notes.append("OpenVINO CPU plugin, NNCF int8 (nncf.quantize on the corpus's calibration batches), float layers strict f32")
            _nncf_peer(model, path, row, reuse)
            continue
        paths[name] = model.onnx_path
        row.size_bytes = _size(model.onnx_path)
        row.config = f"openvino {_short_precision(default_precision() if hint == 'default' else hint)} {FP32_GRAPH}"
        row.notes.append(f"OpenVINO CPU plugin, {'its default precision' if hint == 'default' else 'strict f32'}, on the source ONNX file")
    return rows, {name: path for name, path in paths.items() if next(r for r in rows if r.variant == name).error is None}


def _short_precision(hint: str) -> str:
    """OpenVINO's precision names as edgekit's (f32 -> fp32, f16 -> fp16), so configurations compare."""
    return {"f32": "fp32", "f16": "fp16"}.get(hint.lower(), hint.lower())


def _nncf_peer(model: CorpusModel, out: Path, row: CorpusRow, reuse: bool) -> None:
    """Write ``out``, NNCF's int8 QDQ graph of the source file (reused from an earlier run with ``reuse``), or the row's error."""
    from edgekit.engines.openvino_nncf import quantize_with_nncf
    from edgekit.errors import EdgekitError
    from edgekit.recipe import QuantizationSpec
    from edgekit.target import get_target

    recalled = _recalled_build(out) if reuse and out.is_file() else None
    if recalled is not None:
        row.build_s, row.size_bytes = recalled, _size(out)
        row.notes.append("reused")
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    _forget_build(out)
    start = time.perf_counter()
    try:
        quantize_with_nncf(model.onnx_path, out, QuantizationSpec(), get_target(HOST_TARGET), list(model.calibration))
    except EdgekitError as exc:
        row.error = f"NNCF failed: {exc.message.splitlines()[0]}"
        return
    except Exception as exc:  # the peer's own failure is a result, not a crash of the corpus
        row.error = f"NNCF failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return
    row.build_s, row.size_bytes = time.perf_counter() - start, _size(out)
    _remember_build(out, row.build_s)


# ---------------------------------------------------------------- timing


def interleaved_samples(calls: dict[str, Callable[[], Any]], rounds: int, settle_s: float = 0.06, seed: int = 0) -> dict[str, list[list[float]]]:
    """Latency samples (ms) per variant and round: each round gives every variant a pause (ONNX Runtime's
    pool spins ~50 ms after a run), one untimed call and :data:`CALLS_PER_ROUND` timed ones. The order of the
    variants is shuffled each round (seeded), so that no variant always follows the same neighbour (a slow fp16
    model's run, say) or always takes the same place in the round."""
    for call in calls.values():
        call()
    samples: dict[str, list[list[float]]] = {name: [] for name in calls}
    order = list(calls)
    shuffle = random.Random(seed).shuffle
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            call = calls[name]
            time.sleep(settle_s)
            call()
            this_round = []
            for _ in range(CALLS_PER_ROUND):
                start = time.perf_counter_ns()
                call()
                this_round.append((time.perf_counter_ns() - start) / 1e6)
            samples[name].append(this_round)
    return samples


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if not p.name.endswith(".build.json"))


# ---------------------------------------------------------------- builds


def _error_text(exc: Any) -> str:
    first = exc.message.splitlines()[0]
    return f"{first} (fix: {exc.hint})" if getattr(exc, "hint", None) else first


def _from_manifest(manifest: dict[str, Any], precision: str, row: CorpusRow) -> None:
    row.model_sha256 = (manifest.get("model") or {}).get("sha256")
    plan = (manifest.get("quantization") or {}).get("plan")
    if precision == "auto":
        search = (manifest.get("quantization") or {}).get("auto") or {}
        chosen = str(search.get("chosen") or manifest.get("precision") or "")
        used = str(manifest.get("precision") or "")
        row.chosen = chosen if not used or used in chosen else f"{chosen} ({used})"
        runoff = search.get("runoff")
        if runoff:
            medians = ", ".join(f"{name} {ratio:.3f}x" for name, ratio in runoff["median_ratio"].items())
            row.notes.append(f"run-off ({runoff['rounds']} rounds, median × FP32: {medians})")
    if plan:
        row.notes.extend(note for note in plan.get("notes", []) if note.startswith(("int8-dynamic quantized", "kept float")))
    decision = manifest.get("precision_decision") or {}
    if decision.get("refused_because"):
        row.notes.append(f"fell back from {decision.get('requested')}: {decision['refused_because']}")
    tensorrt = (manifest.get("backend") or {}).get("tensorrt") or {}
    if tensorrt.get("engine_built_on") == "device":
        row.notes.append("TensorRT engine is built on the device (this host has no TensorRT)")


def _build(recipe: Path, target: str, precision: str, out: Path, row: CorpusRow, reuse: bool) -> Path | None:
    """Build one bundle (or reuse the one at ``out``); fills the row's build time, size and notes."""
    from edgekit.errors import EdgekitError
    from edgekit.pipeline import build

    if reuse and (out / "manifest.json").is_file():
        manifest = json.loads((out / "manifest.json").read_text())
        row.build_s = _recalled_build(out) or sum(float(s.get("seconds", 0)) for s in manifest.get("stages", []))
        row.notes.append("reused")
    else:
        start = time.perf_counter()
        try:
            manifest = build(recipe, target, precision=precision, out=out, force=True).manifest
        except EdgekitError as exc:
            row.error = _error_text(exc)
            return None
        finally:
            row.build_s = time.perf_counter() - start
        _remember_build(out, row.build_s)
    _from_manifest(manifest, precision, row)
    row.size_bytes = _size(out / "model.onnx")
    return out


def golden_check(bundle_dir: Path, threads: int) -> str:
    """The runtime's golden self-check of a bundle, as a device runs it before serving: "pass", or what failed.
    A TensorRT bundle is checked on ONNX Runtime's CPU provider here (its QDQ graph), as the build's golden stage does."""
    from edgekit_runtime.backends import OnnxRuntimeRunner, create_runner
    from edgekit_runtime.bundle import open_bundle, self_check
    from edgekit_runtime.errors import EdgekitError

    try:
        bundle = open_bundle(bundle_dir)
        stand_in = bundle.backend.get("name") == "tensorrt"
        runner = (OnnxRuntimeRunner.from_bundle(bundle, execution_providers=["CPUExecutionProvider"], intra_op_threads=threads)
                  if stand_in else create_runner(bundle, **{"threads" if bundle.backend.get("name") == "openvino" else "intra_op_threads": threads}))
        result = self_check(bundle, runner, raise_on_failure=False)
    except EdgekitError as exc:
        return f"fail: {exc.message.splitlines()[0]}"
    on = " (on ONNX Runtime CPU: no TensorRT here)" if stand_in else ""
    if result.passed:
        return f"pass{on}"
    failed = [check.name for check in result.outputs if not check.passed]
    return f"fail{on}: outputs {', '.join(failed)}"


def bench_dims(onnx_path: Path, bench: Batch) -> dict[str, int]:
    """Every named (dynamic) dim of the model's inputs at the size the bench batch gives it, so the estimate
    is of the shape the host times (a dim named by the exporter, like Paddle's ``x_dim0``, included)."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    sizes: dict[str, set[int]] = {}
    for value in graph.input:
        if value.name not in bench:
            continue
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_param") and axis < bench[value.name].ndim:
                sizes.setdefault(dim.dim_param, set()).add(int(bench[value.name].shape[axis]))
    return {name: next(iter(found)) for name, found in sizes.items() if len(found) == 1}  # a name used at two sizes ('?') is left to the estimator


def _estimate(bundle_dir: Path, target: str, bench: Batch, row: CorpusRow) -> None:
    from edgekit.errors import EdgekitError
    from edgekit.estimate.inputs import estimate_path

    try:
        estimate, _ = estimate_path(bundle_dir, target, dims=bench_dims(bundle_dir / "model.onnx", bench))
    except EdgekitError as exc:
        row.notes.append(f"no estimate: {exc.message.splitlines()[0]}")
        return
    row.estimate_p50_ms = estimate.p50_ms
    row.estimate_engine = estimate.engine + (f" at {estimate.power_mode}" if estimate.power_mode else "")


def _judge(row: CorpusRow, value: float | None, min_value: float) -> None:
    row.metric, row.min_value = value, min_value
    row.meets_budget = None if value is None else bool(value >= min_value)


# ---------------------------------------------------------------- one model


def run_model(model: CorpusModel, work: Path, targets: Sequence[str] = TARGETS, precisions: Sequence[str] = PRECISIONS,
              rounds: int = 10, threads: int = 2, peers: bool = True, reuse: bool = False,
              other_precisions: Sequence[str] | None = None, openvino: bool = False) -> list[CorpusRow]:
    """Build, self-check, evaluate and time one model; rows for every (target, variant). The host target's
    rows are evaluated and timed here; other targets' rows (at ``other_precisions``, default ``precisions``)
    carry the build's own (host) evaluation and ``edgekit estimate``'s p50 for the target. ``openvino``: OpenVINO's
    peers too (:func:`openvino_peers`), timed in the same rounds."""
    spec = evaluation_spec(model)
    metric_name = _metric_name(spec)
    recipe = write_recipe(model, work / "recipe")
    auto_recipe = write_recipe(model, work / "recipe-auto", min_value=model.min_value)
    rows: list[CorpusRow] = []
    bundles: dict[str, Path] = {}
    hints: dict[str, str] = {}  # variant -> OpenVINO precision hint, for those OpenVINO runs (the rest: ONNX Runtime)
    for target in targets:
        for precision in precisions if target == HOST_TARGET or other_precisions is None else other_precisions:
            row = CorpusRow(model.name, precision, target, metric_name=metric_name, min_value=model.min_value)
            rows.append(row)
            log.info("%s: build %s %s", model.name, target, precision)
            bundle = _build(auto_recipe if precision == "auto" else recipe, target, precision, work / "bundles" / target / precision, row, reuse)
            if bundle is None:
                continue
            row.golden = golden_check(bundle, threads)
            if target == HOST_TARGET:
                bundles[precision] = bundle / "model.onnx"
                backend = json.loads((bundle / "manifest.json").read_text()).get("backend") or {}
                if backend.get("name") == "openvino":
                    hints[precision] = str((backend.get("openvino") or {}).get("inference_precision_hint", "f32"))
                    row.config = _auto_config(row.chosen, hints[precision]) if precision == "auto" else None
            else:
                _estimate(bundle, target, model.bench, row)
                accuracy = json.loads((bundle / "manifest.json").read_text()).get("accuracy") or {}
                if accuracy.get("metric") == spec.metric and accuracy.get("value") is not None:
                    _judge(row, float(accuracy["value"]), model.min_value)
                    row.notes.append("task metric from the build's evaluation on this host")
    if HOST_TARGET not in targets:
        return rows
    host = [r for r in rows if r.target == HOST_TARGET]
    if peers:
        for row in ort_peers(model, work / "peers", reuse):
            row.metric_name, row.min_value = metric_name, model.min_value
            host.append(row)
            if row.error is None:
                bundles[row.variant] = peer_path(work / "peers", row.variant)
    if openvino:
        ov_rows, ov_paths = openvino_peers(model, work / "peers", reuse)
        for row in ov_rows:
            row.metric_name, row.min_value = metric_name, model.min_value
            host.append(row)
        for name, path in ov_paths.items():
            bundles[name], hints[name] = path, OPENVINO_PEER_HINTS[name]
    if "fp32" in bundles:
        measure_host(model, host, bundles, rounds, threads, hints)
    return host + [r for r in rows if r.target != HOST_TARGET]


#: auto's NNCF int8 candidate and the NNCF peer: ``nncf.quantize`` with NNCF's CPU defaults on the corpus's calibration
#: batches (the recipe's data), float layers strict f32; the FP32 export's graph for auto, the source file for the peer,
#: as auto's float candidates and OpenVINO's float peers are.
NNCF_CONFIG = "openvino int8 NNCF graph"


def _auto_config(chosen: str | None, hint: str) -> str | None:
    """The configuration of auto's OpenVINO choice: its float candidates (openvino-bf16, openvino-fp32) compile the FP32
    export at their hint; openvino-nncf-int8 is NNCF's int8 graph of it (the NNCF peer's configuration); openvino-int8
    compiles edgekit's own int8 QDQ graph, which no peer runs."""
    if chosen and chosen.startswith("openvino-nncf-int8"):
        return NNCF_CONFIG
    if not chosen or not chosen.startswith(("openvino-bf16", "openvino-fp32", "openvino-fp16")):
        return None
    return f"openvino {_short_precision(hint)} {FP32_GRAPH}"


def _metric_name(spec: Any) -> str:
    options = spec.options
    report = getattr(options, "report", None)
    match_iou = getattr(options, "match_iou", None)
    return str(spec.metric) + (f" {report}" if report else "") + (f" mAP@{match_iou:g}" if match_iou else "")


def evaluate_outputs(session: Any, model: CorpusModel) -> list[dict[str, np.ndarray]]:
    """Every output over the evaluation batches; a stateful model's sequences (``sequence_length`` consecutive
    batches) carry the state this variant computed on the previous call, as on the device."""
    outputs: list[dict[str, np.ndarray]] = []
    carried: dict[str, np.ndarray] = {}
    for index, batch in enumerate(model.evaluation):
        if model.state and index % max(model.sequence_length, 1):
            batch = {**batch, **carried}
        result = _outputs(session, batch)
        carried = {state_input: result[output] for state_input, output in model.state if output in result}
        outputs.append(result)
    return outputs


def _bench_call(session: Any, batch: Batch) -> Callable[[], Any]:
    feeds = _feeds(session, batch)
    return lambda: session.run(None, feeds)


def outputs_and_samples(model: CorpusModel, paths: dict[str, Path], rounds: int, threads: int,
                        hints: dict[str, str] | None = None) -> tuple[dict[str, list[dict[str, np.ndarray]]], dict[str, list[list[float]]], dict[str, str]]:
    """Every variant's outputs over the evaluation batches and its interleaved latency samples, in this process.
    ``hints``: the variants OpenVINO runs, with their precision hint ("default": OpenVINO's own). A variant that cannot
    open or run (Silero VAD's LSTM inside ``If``: OpenVINO's ONNX frontend needs static ranks; a peer file ONNX Runtime
    cannot parse) is left out with the reason, the third value: a peer's failure is a result, not the end of the model's
    rows."""
    # Spinning off: the variants run back to back, and a pool left spinning by one would take a core from the next.
    sessions, errors, outputs = {}, {}, {}
    for name, path in paths.items():
        hint = (hints or {}).get(name)
        try:
            sessions[name] = _session(path, threads, hint)
            outputs[name] = evaluate_outputs(sessions[name], model)
            _bench_call(sessions[name], model.bench)()  # the timed batch too, before the rounds
        except Exception as exc:
            sessions.pop(name, None)
            outputs.pop(name, None)
            text = " ".join(str(exc).split())
            errors[name] = f"{'ONNX Runtime' if hint is None else 'OpenVINO'} failed: {text[:300] if text else type(exc).__name__}"
    return outputs, interleaved_samples({name: _bench_call(s, model.bench) for name, s in sessions.items()}, rounds), errors


def _session(path: Path, threads: int, hint: str | None) -> Any:
    """An ONNX Runtime session of ``path``, or (``hint``) an OpenVINO compiled model with the same calls."""
    if hint is None:
        return cpu_session(path, threads, allow_spinning=False, log_severity_level=2)
    from edgekit.engines.openvino_session import OpenVinoSession

    return OpenVinoSession(path, None if hint == "default" else hint, threads)


def measure_host(model: CorpusModel, rows: list[CorpusRow], paths: dict[str, Path], rounds: int, threads: int,
                 hints: dict[str, str] | None = None) -> None:
    """Evaluate (task metric and cosine against FP32's outputs) and time every variant in ``paths`` interleaved.

    The sessions live in a fresh process: in the process that had just built the bundles, byte-identical
    files timed 1.6x apart (ResNet's FP32 and auto bundles, 2.1 ms and 3.35 ms), and in a fresh one equal."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        outputs, samples, errors = pool.submit(outputs_and_samples, model, paths, rounds, threads, hints).result()
    for row in rows:
        if row.variant in errors:
            row.error = errors[row.variant]
    paths = {name: path for name, path in paths.items() if name not in errors}
    for row in rows:
        if row.variant not in paths:
            continue
        if "fp32" in outputs:  # the reference; without it (its row has the error) the others are timed, not scored
            value, _ = task_metric(model, outputs[row.variant], outputs["fp32"])
            _judge(row, float(value), model.min_value)
            row.cosine = cosine([o[model.output] for o in outputs[row.variant]], [o[model.output] for o in outputs["fp32"]])
        flat = [t for per_round in samples[row.variant] for t in per_round]
        row.p50_ms = float(np.median(flat))
        row.p25_ms, row.p75_ms = (float(q) for q in np.percentile(flat, [25, 75]))
        row.round_ms = [float(np.median(per_round)) for per_round in samples[row.variant]]
    by_variant = {r.variant: r for r in rows}
    fp32 = by_variant["fp32"].p50_ms
    in_budget = [by_variant[p] for p in PEERS if p in by_variant and by_variant[p].p50_ms is not None and by_variant[p].meets_budget]
    best = min(in_budget, key=lambda r: r.p50_ms or 0.0, default=None)
    for row in rows:
        if row.p50_ms is None:
            continue
        row.x_fp32 = row.p50_ms / fp32 if fp32 else None
        if best is not None and best.p50_ms:
            row.x_best_ort, row.best_ort = row.p50_ms / best.p50_ms, best.variant
