"""``estimate(...)``: what a graph will do on a target, from its per-node work and the target's figures.

Everything here is an ESTIMATE: a roofline sum with efficiency factors (defaults or fitted by
``edgekit fleet calibrate``), never a measurement. :class:`Estimate` lists the factors it used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgekit.estimate.calibration import default_calibration_path, factors_for, load_calibration
from edgekit.estimate.graph_cost import ALL_CLASSES, EstimateError, GraphCost, graph_costs
from edgekit.estimate.hardware import Hardware, hardware_for
from edgekit.estimate.roofline import RUNTIME_OVERHEAD_MB, Factors, apply_factors, engine_kind, host_factors, roofline
from edgekit.target import TargetProfile

#: how a graph is grouped before it is timed: one roofline per ONNX node, or per TensorRT fused layer
LAYER_MODELS = ("per-node", "tensorrt")
#: How a graph stored at one precision is timed at another (``assume_precision`` on an FP32 export):
#: the byte scale of every tensor moved, relative to FP32.
#: The block formats count their scales: NVFP4 4 bits + an FP8 scale per 16, MXFP4 4 bits + an E8M0 scale per 32, MXFP8 8 + 8/32.
ASSUMED_BYTE_SCALE = {"fp32": 1.0, "fp16": 0.5, "bf16": 0.5, "int8": 0.25, "int8-dynamic": 0.25, "fp8": 0.25, "int4": 0.25,
                      "nvfp4": 4.5 / 32, "mxfp4": 4.25 / 32, "mxfp8": 8.25 / 32}  # fmt: skip
ASSUMED_COMPUTE_CLASSES = ("conv", "matmul", "attention")


@dataclass(frozen=True)
class ModeEnergy:
    """Energy at one power mode. ``latency_ms`` is one call of ``batch`` samples; ``energy_per_call_mj`` is that
    call's energy and ``energy_per_inference_mj`` is per SAMPLE (the call's energy / batch), matching throughput,
    which counts samples."""

    power_mode: str
    watts: float
    latency_ms: float
    energy_per_call_mj: float
    batch: int = 1

    @property
    def energy_per_inference_mj(self) -> float:
        """Energy per sample (one inference), in mJ: the call's energy divided by its batch."""
        return self.energy_per_call_mj / max(self.batch, 1)


@dataclass(frozen=True)
class Estimate:
    """An estimate of one graph on one target (kind is always "estimate")."""

    target: str
    power_mode: str | None
    engine: str
    batch: int
    p50_ms: float
    throughput_per_s: float | None  # None where the graph has no work to time (p50 0 ms): no figure, not 0/s
    weights_mb: float  # decimal MB (10^6 bytes), as everywhere in edgekit's output
    activations_mb: float
    runtime_overhead_mb: float
    by_class: dict[str, dict[str, float]]  # class -> nodes, ops, bytes, ms, share
    energy: tuple[ModeEnergy, ...]
    factors: tuple[str, ...]  # what the estimate rests on, in words
    calibration: dict[str, Any]
    hardware: dict[str, Any]
    cost: GraphCost = field(repr=False, compare=False)
    node_ms: tuple[tuple[str, str, str, float], ...] = field(default=(), repr=False)  # name, op, class, ms
    layer_model: str = "per-node"  # how the graph was timed: one roofline per ONNX node, or per TensorRT fused layer

    @property
    def peak_memory_mb(self) -> float:
        return self.weights_mb + self.activations_mb + self.runtime_overhead_mb

    def no_energy_text(self) -> str:
        """Why there is no energy figure: energy per inference needs the target's power modes (their watts)."""
        return (f"not estimated: energy needs power_modes (mode name: watts) in the target profile, and {self.target} "
                "has none")

    def throughput_text(self, digits: int = 1) -> str:
        """``1234.5 /s``, or why there is no figure (a graph without nodes: only the runtime's call overhead is left)."""
        if self.throughput_per_s is None:
            return "no figure (the graph has no nodes to time; a call costs the runtime's own overhead)"
        return f"{self.throughput_per_s:.{digits}f} /s"

    def to_json(self, nodes: bool = False) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "kind": "estimate", "target": self.target, "power_mode": self.power_mode, "engine": self.engine,
            "batch": self.batch, "layer_model": self.layer_model, "p50_ms": self.p50_ms, "throughput_per_s": self.throughput_per_s,
            "memory_mb": {"weights": self.weights_mb, "activations": self.activations_mb,
                          "runtime_overhead": self.runtime_overhead_mb, "peak": self.peak_memory_mb},
            "energy": [{"power_mode": e.power_mode, "watts": e.watts, "p50_ms": e.latency_ms, "batch": e.batch,
                        "energy_per_inference_mj": e.energy_per_inference_mj, "energy_per_call_mj": e.energy_per_call_mj}
                       for e in self.energy],
            "by_class": self.by_class, "total_ops": self.cost.total_ops, "dims": self.cost.dims,
            "factors": list(self.factors), "calibration": self.calibration, "hardware": self.hardware,
        }  # fmt: skip
        if not self.energy:  # why the list is empty, as the text output says
            doc["energy_note"] = self.no_energy_text()
        if nodes:
            doc["nodes"] = [{"name": n, "op_type": op, "op_class": cls, "ms": ms} for n, op, cls, ms in self.node_ms]
        return doc


def stored_precisions(cost: GraphCost) -> set[str]:
    """The precisions the graph's conv / matmul / attention nodes compute at as stored (every node's, if it has none)."""
    compute = {n.precision for n in cost.nodes if not n.fused and n.op_class in ASSUMED_COMPUTE_CLASSES}
    return compute or {n.precision for n in cost.nodes if not n.fused}


def _assume(cost: GraphCost, precision: str | None) -> tuple[GraphCost, list[str]]:
    if precision is None:
        return cost, []
    if precision not in ASSUMED_BYTE_SCALE:
        raise EstimateError(f"cannot time a graph as {precision}", hint=f"choose one of {', '.join(ASSUMED_BYTE_SCALE)}")
    stored = stored_precisions(cost)
    if stored and stored != {"fp32"}:  # the byte scale is relative to FP32: it would shrink an fp16 / int8 graph again
        listed = ", ".join(sorted(stored))
        if stored == {precision.split("-")[0]}:
            return cost, [f"graph already stored as {listed}: timed as stored ({precision} asked; no bytes scaled)"]
        raise EstimateError(f"cannot time a graph stored as {listed} as {precision}: an assumed precision rescales an FP32 "
                            "graph's bytes", hint="pass the FP32 bundle or its .onnx with --precision, or drop --precision to "
                            "time this graph as stored")  # fmt: skip
    scale = ASSUMED_BYTE_SCALE[precision]
    nodes = tuple(replace(n, precision=precision if n.op_class in ASSUMED_COMPUTE_CLASSES and n.precision == "fp32" else n.precision,
                          bytes_read=n.bytes_read * scale, bytes_written=n.bytes_written * scale, weight_bytes=n.weight_bytes * scale)
                  for n in cost.nodes)  # fmt: skip
    adjusted = replace(cost, nodes=nodes, weight_bytes=cost.weight_bytes * scale, peak_activation_bytes=cost.peak_activation_bytes * scale,
                       tensor_bytes={name: size * scale for name, size in cost.tensor_bytes.items()})
    return adjusted, [f"graph stored as FP32, timed as {precision}: compute classes at the {precision} peak, bytes x{scale:g}"]


def resolve_factors(hardware: Hardware, calibration: Path | Mapping[str, Any] | None) -> tuple[Factors, dict[str, Any]]:
    """The factors for the hardware: the calibration's entry for its target and mode, else the defaults."""
    document: Mapping[str, Any] | None = None
    where = None
    if isinstance(calibration, Mapping):
        document, where = calibration, "given calibration"
    elif calibration is not None:
        document, where = load_calibration(Path(calibration)), str(calibration)
    elif default_calibration_path().is_file():
        document, where = load_calibration(default_calibration_path()), str(default_calibration_path())
    if document is not None:
        fitted = factors_for(document, hardware.target, hardware.power_mode)
        if fitted is not None:
            return fitted, {"file": where, "calibrated": True}
    return host_factors(hardware), {"file": where, "calibrated": False}


def estimate(model: Any, target: TargetProfile, *, dims: Mapping[str, int] | None = None, batch: int | None = None,
             power_mode: str | None = None, calibration: Path | Mapping[str, Any] | None = None,
             measured_peak: Mapping[str, Any] | None = None, assume_precision: str | None = None,
             cost: GraphCost | None = None, layer_model: str | None = None) -> Estimate:  # fmt: skip
    """Estimate ``model`` (ONNX path or ModelProto) on ``target`` at ``dims`` (the benchmark shape).
    With ``measured_peak`` (this host runs it, on ONNX Runtime's CPU provider) the graph costed is the one ONNX
    Runtime optimises (:mod:`edgekit.estimate.runtime_graph`); otherwise the exported graph with implicit fusions.
    ``layer_model``: "tensorrt" (the graph as TensorRT's fused layers, :mod:`edgekit.estimate.tensorrt_layers`) or
    "per-node"; default: "tensorrt" on a GPU target whose preferred backend is TensorRT, else "per-node"."""
    if layer_model is not None and layer_model not in LAYER_MODELS:
        raise EstimateError(f"layer model '{layer_model}' is not one of {', '.join(LAYER_MODELS)}",
                            hint="'tensorrt' to time TensorRT's fused layers, 'per-node' for one roofline per ONNX node")  # fmt: skip

    small = {name: size for name, size in {**(dims or {}), **({"batch": batch} if batch is not None else {})}.items() if int(size) < 1}
    if small:
        raise EstimateError(f"dims must be >= 1: {', '.join(f'{k}={v}' for k, v in small.items())}", hint="a dim is a size: give it 1 or more, e.g. --shape batch=1")

    def figures(mode: str | None) -> Hardware:
        found = hardware_for(target, mode, measured=measured_peak)
        return replace(found, layer_model=layer_model) if layer_model is not None else found

    if cost is None and measured_peak is not None:
        from edgekit.estimate.host_peak import host_threads
        from edgekit.estimate.runtime_graph import runtime_graph_costs

        cost = runtime_graph_costs(model, host_threads(target.cpu.cores), dims=dims or {})
    cost = cost if cost is not None else graph_costs(model, dims or {})
    cost, notes = _assume(cost, assume_precision)
    hardware = figures(power_mode)
    line = roofline(cost, hardware)
    runs_on = hardware
    if hardware.fallback is not None and line.counted_nodes and line.fallback_nodes == line.counted_nodes:
        runs_on = hardware.fallback  # every node runs on the CPU fallback: its engine, factors and runtime memory
    factors, calibration_info = resolve_factors(runs_on, calibration)
    timed, latency = apply_factors(line, factors)
    engine = runs_on.engine if runs_on is not hardware or not line.fallback_nodes else f"{hardware.engine}+{hardware.fallback.engine}"  # type: ignore[union-attr]
    by_class: dict[str, dict[str, float]] = {}
    raw = cost.by_class()
    layered = hardware.layer_model == "tensorrt"  # "nodes" are TensorRT layers: count those, the ONNX work beside them
    for cls in ALL_CLASSES:
        ms = sum(n.ms for n in timed if n.op_class == cls)
        count = sum(1 for n in timed if n.op_class == cls)
        if (cls in raw or layered) and ((raw.get(cls, {}).get("nodes") and not layered) or count or ms):
            row = {**raw.get(cls, {"nodes": 0, "ops": 0.0, "bytes": 0.0}), **({"nodes": count} if layered else {})}
            by_class[cls] = {**row, "ms": ms, "share": ms / latency if latency else 0.0,
                             "compute_bound_nodes": sum(1 for n in timed if n.op_class == cls and n.bound == "compute")}  # fmt: skip
    batch = int(batch or (cost.dims.get("batch") if cost.dims else None) or 1)
    energy = []
    for mode, watts in target.power_modes.items():
        mode_hw = hardware if mode == hardware.power_mode else figures(mode)
        mode_factors = resolve_factors(mode_hw.fallback if runs_on is not hardware and mode_hw.fallback else mode_hw, calibration)[0]
        mode_ms = apply_factors(roofline(cost, mode_hw), mode_factors)[1]
        energy.append(ModeEnergy(mode, watts, mode_ms, watts * mode_factors.power_fraction * mode_ms, batch))
    words = [
        ("ESTIMATE, not a measurement: per-layer roofline max(ops/peak, bytes/bandwidth) / efficiency + launch cost per layer, "
         "over the graph fused as TensorRT fuses it" if layered else
         "ESTIMATE, not a measurement: per-node roofline max(ops/peak, bytes/bandwidth) / efficiency + per-node overhead"),
        *hardware.sources, *line.notes, *notes, *cost.assumptions,
        f"efficiency factors ({factors.source}): " + ", ".join(f"{k} {v:g}" for k, v in sorted(factors.efficiency.items())),
        f"{'launch cost per layer' if layered else 'per-node overhead'} {factors.node_overhead_us:g} us over {line.counted_nodes} "
        f"{'layers' if layered else 'nodes'} ({factors.source})",
        f"shapes from {cost.shape_source} at {cost.dims or 'static shapes'}",
        f"runtime memory overhead {RUNTIME_OVERHEAD_MB[engine_kind(runs_on.engine)]:g} MB (an estimate for the runtime's libraries and arenas)",
    ]  # fmt: skip
    if energy:
        words.append(f"energy per inference = power mode watts x {factors.power_fraction:g} active share x latency of one "
                     f"batch-{batch} call / {batch} samples ({factors.source})")
    return Estimate(
        target=target.name, power_mode=hardware.power_mode, engine=engine, batch=batch, p50_ms=latency,
        throughput_per_s=batch * 1000.0 / latency if latency else None, weights_mb=cost.weight_bytes / 1e6,
        activations_mb=cost.peak_activation_bytes / 1e6, runtime_overhead_mb=RUNTIME_OVERHEAD_MB[engine_kind(runs_on.engine)],
        by_class=by_class, energy=tuple(energy), factors=tuple(words), calibration={**calibration_info, **factors.to_json()},
        hardware=hardware.to_json(), cost=cost, node_ms=tuple((n.name, n.op_type, n.op_class, n.ms) for n in timed),
        layer_model=hardware.layer_model,
    )  # fmt: skip


@dataclass(frozen=True)
class EstimateInput:
    """A graph to estimate with its benchmark shape, and the host measurement a bundle carries."""

    model_path: Path
    dims: dict[str, int]
    batch: int | None
    name: str
    precision: str | None
    measured_p50_ms: float | None = None
    measured_on: str | None = None


def bundle_input(path: Path) -> EstimateInput:
    """A bundle directory (manifest.json + model) or a bare ``.onnx`` file."""
    path = Path(path)
    if path.is_file() and path.suffix == ".onnx":
        return EstimateInput(path, {}, None, path.stem, None)
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        raise EstimateError(f"{path} is neither a bundle directory (no manifest.json) nor an .onnx file",
                            hint="pass the folder `edgekit build` wrote, its model.onnx, or a recipe .yaml")  # fmt: skip
    hint = "rebuild the bundle with `edgekit build`, or pass its model.onnx with --shape"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise EstimateError(f"{manifest_path}: not readable JSON ({exc})", hint=hint) from exc
    if not isinstance(manifest, dict):
        raise EstimateError(f"{manifest_path}: not a bundle manifest (a {type(manifest).__name__}, not an object)", hint=hint)
    model_entry, bench = manifest.get("model"), manifest.get("benchmark") or {}
    if not isinstance(model_entry, dict) or not isinstance(model_entry.get("path"), str):
        raise EstimateError(f"{manifest_path}: model.path must name the bundle's ONNX file", hint=hint)
    if not isinstance(bench, dict) or not isinstance(bench.get("shape") or {}, dict):
        raise EstimateError(f"{manifest_path}: benchmark.shape must map dim names to sizes, e.g. {{\"batch\": 8}}", hint=hint)
    model = path / model_entry["path"]
    dims = {}
    for name, size in (bench.get("shape") or {}).items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise EstimateError(f"{manifest_path}: benchmark.shape.{name} must be a whole number >= 1, not {size!r}", hint=hint)
        dims[str(name)] = size
    batch, p50 = bench.get("batch"), bench.get("p50_ms")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise EstimateError(f"{manifest_path}: benchmark.batch must be a whole number >= 1, not {batch!r}", hint=hint)
    if p50 is not None and (isinstance(p50, bool) or not isinstance(p50, (int, float))):
        raise EstimateError(f"{manifest_path}: benchmark.p50_ms must be a number of milliseconds, not {p50!r}", hint=hint)
    return EstimateInput(model, dims, bench.get("batch"), str(manifest.get("name", path.name)), manifest.get("precision"),
                         bench.get("p50_ms"), (bench.get("host") or {}).get("cpu") if isinstance(bench.get("host"), dict) else bench.get("host"))  # fmt: skip
