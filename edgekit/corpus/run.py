"""One corpus model through every precision: edgekit builds (the pipeline, as a user runs it), ONNX
Runtime's own quantizers as the peers to beat, the task metric against FP32, and latency timed
interleaved (every variant gets a turn each round, so noise on a shared host hits all of them alike)."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from edgekit.corpus.base import Batch, CorpusModel
from edgekit.corpus.metrics import TASK_METRICS, cosine
from edgekit.corpus.recipes import write_recipe

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "int8", "int8-dynamic", "auto")
PEERS = ("ort-quantize_static", "ort-quantize_dynamic")
#: --precision auto's budget: mean cosine of the output to FP32.
AUTO_MIN_COSINE = 0.98


@dataclass
class CorpusRow:
    model: str
    variant: str  # an edgekit precision, or a peer from PEERS
    target: str
    size_bytes: int | None = None
    build_s: float | None = None
    metric_name: str = ""
    metric: float | None = None
    cosine: float | None = None
    p50_ms: float | None = None
    x_fp32: float | None = None
    x_best_ort: float | None = None  # latency over the faster ONNX Runtime quantizer's
    chosen: str | None = None  # auto: the precision and plan it chose
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.set_denormal_as_zero", "1")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _feeds(session: Any, batch: Batch) -> dict[str, np.ndarray]:
    names = {i.name for i in session.get_inputs()}
    return {k: v for k, v in batch.items() if k in names}


def ort_peers(model: CorpusModel, work: Path) -> dict[str, Path]:
    """ONNX Runtime's quantize_static (QDQ, per-channel int8 weights, uint8 activations, MinMax on the
    corpus's calibration batches) and quantize_dynamic (per-channel int8), after its own pre-processing."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

    from edgekit.quantize.ort_writers import preprocess

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self, batches: list[Batch]) -> None:
            self.batches = iter(batches)

        def get_next(self) -> Batch | None:
            return next(self.batches, None)

    work.mkdir(parents=True, exist_ok=True)
    pre = preprocess(model.onnx_path, work / "pre.onnx")
    out = {"ort-quantize_static": work / "ort_static.onnx", "ort-quantize_dynamic": work / "ort_dynamic.onnx"}
    quantize_static(str(pre), str(out["ort-quantize_static"]), Reader(model.calibration), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    quantize_dynamic(str(pre), str(out["ort-quantize_dynamic"]), per_channel=True, weight_type=QuantType.QInt8)
    return out


def interleaved_p50_ms(calls: dict[str, Callable[[], Any]], rounds: int, settle_s: float = 0.06) -> dict[str, float]:
    """Median latency per variant: each round gives every variant a pause (ONNX Runtime's pool spins ~50 ms
    after a run), one untimed call and three timed ones."""
    for call in calls.values():
        call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            time.sleep(settle_s)
            call()
            for _ in range(3):
                start = time.perf_counter_ns()
                call()
                samples[name].append((time.perf_counter_ns() - start) / 1e6)
    return {name: float(np.median(values)) for name, values in samples.items()}


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def _build(recipe: Path, target: str, precision: str, out: Path, row: CorpusRow) -> Path | None:
    from edgekit.errors import EdgekitError
    from edgekit.pipeline import build

    start = time.perf_counter()
    try:
        result = build(recipe, target, precision=precision, out=out, force=True)
    except EdgekitError as exc:
        row.error = exc.message.splitlines()[0]
        return None
    finally:
        row.build_s = time.perf_counter() - start
    manifest = result.manifest
    plan = (manifest.get("quantization") or {}).get("plan")
    if precision == "auto":
        row.chosen = str(manifest.get("precision_decision", {}).get("reason", "")).removeprefix("auto: ")
    if plan:
        row.notes.extend(note for note in plan.get("notes", []) if note.startswith(("int8-dynamic quantized", "kept float")))
    return result.bundle_dir / "model.onnx"


def run_model(model: CorpusModel, work: Path, targets: Sequence[str] = ("x86-64-cpu",), precisions: Sequence[str] = PRECISIONS,
              rounds: int = 10, threads: int = 2, peers: bool = True) -> list[CorpusRow]:
    """Build, evaluate and time one model; rows for every (target, variant). Only the host's own target
    (x86-64-cpu) is timed and evaluated here; other targets' rows record the build (size, time, errors)."""
    metric_name, metric = TASK_METRICS[model.task]
    recipe = write_recipe(model, work / "recipe")
    auto_recipe = write_recipe(model, work / "recipe-auto", min_value=AUTO_MIN_COSINE)
    rows: list[CorpusRow] = []
    paths: dict[str, Path] = {}
    for target in targets:
        for precision in precisions:
            row = CorpusRow(model.name, precision, target, metric_name=metric_name)
            path = _build(auto_recipe if precision == "auto" else recipe, target, precision, work / "bundles" / target / precision, row)
            if path is not None:
                row.size_bytes = _size(path)
                if target == "x86-64-cpu":
                    paths[precision] = path
            rows.append(row)
    host = [r for r in rows if r.target == "x86-64-cpu"]
    if peers and "x86-64-cpu" in targets:
        start = time.perf_counter()
        for name, path in ort_peers(model, work / "peers").items():
            row = CorpusRow(model.name, name, "x86-64-cpu", size_bytes=_size(path), build_s=time.perf_counter() - start, metric_name=metric_name)
            paths[name] = path
            rows.append(row)
            host.append(row)
    if "fp32" not in paths:
        return rows
    sessions = {name: _session(path, threads) for name, path in paths.items()}
    outputs = {name: [s.run([model.output], _feeds(s, b))[0] for b in model.evaluation] for name, s in sessions.items()}
    latency = interleaved_p50_ms({name: (lambda s=s: s.run([model.output], _feeds(s, model.bench))) for name, s in sessions.items()}, rounds)
    best_ort = min((latency[p] for p in PEERS if p in latency), default=None)
    for row in host:
        if row.variant not in paths:
            continue
        row.metric = metric(outputs[row.variant], outputs["fp32"])
        row.cosine = cosine(outputs[row.variant], outputs["fp32"])
        row.p50_ms = latency[row.variant]
        row.x_fp32 = latency[row.variant] / latency["fp32"]
        row.x_best_ort = latency[row.variant] / best_ort if best_ort else None
    return rows
