"""What a target can do, for the roofline: peak ops/s per precision on the engine that runs the model,
memory bandwidth, and the watts of each power mode, each with where the figure came from.

Figures come from the target profile (``peak_throughput``, ``memory``, ``power_modes``), never invented.
Rules that fill gaps are listed in :data:`DERIVATIONS` and are named in every estimate that used them:

* a sparse vendor figure counts half (2:4 structured sparsity doubles the quoted rate);
* FP32 on a GPU without an FP32 figure: ``cuda_cores x 2 x gpu.max_clock_mhz`` when the profile has the clock;
* on an NVIDIA Ampere GPU, FP16 tensor-core throughput is half the dense INT8 rate and FP32 (CUDA cores)
  a sixteenth, the ratios of the AGX Orin technical brief (5.3 FP32 TFLOPS, 170 sparse INT8 TOPS on its GPU);
* a figure quoted at one power mode is scaled to another by the ratio of the modes' watts (an estimate:
  clocks roughly follow the power cap; calibrate per mode with ``edgekit fleet calibrate`` to replace it);
* FP32 on a Blackwell GPU without an FP32 figure: TensorRT runs FP32 convolutions and GEMMs as TF32 on the tensor
  cores (its TF32 builder flag is on by default), at half the FP16 rate (the H100 datasheet ratio, 989 vs 1979);
* a precision the main engine cannot run goes to the engine that runs it instead: FP32 on an NPU that compiles it
  to FP16 (``npu.fp32_runs_as``) at the NPU's FP16 figure, otherwise to the CPU (the CPU execution provider
  fallback) at the target's ``engine: cpu`` figures; every estimate names that engine and how many nodes it took;
* a target with no memory bandwidth figure gets a LOWER BOUND: memory traffic is not timed, and the estimate says so;
* a target with no peak figures (generic CPU hosts) needs a measured peak: :mod:`edgekit.estimate.host_peak`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgekit.estimate.graph_cost import EstimateError
from edgekit.target import TargetProfile

#: architecture -> precision -> (ratio to dense int8, the source of the ratio)
DERIVATIONS: dict[str, dict[str, tuple[float, str]]] = {
    "ampere": {
        "fp16": (0.5, "Ampere tensor cores: FP16 at half the dense INT8 rate"),
        "bf16": (0.5, "Ampere tensor cores: BF16 at half the dense INT8 rate"),
        "fp32": (1.0 / 16.0, "AGX Orin technical brief ratio: 5.3 FP32 TFLOPS vs 85 dense INT8 TOPS on the GPU"),
    },
    "hopper": {"fp32": (67.0 / 1979.0, "H100 datasheet ratio: 67 FP32 TFLOPS vs 1979 dense INT8 TOPS")},
    "blackwell": {"fp16": (0.5, "Blackwell tensor cores: FP16 at half the FP8 rate"),
                  "fp32": (0.25, "TensorRT runs FP32 convolutions and GEMMs as TF32 on the tensor cores (TF32 builder flag on by "
                                 "default), at half the FP16 rate (H100 datasheet ratio: 989 TF32 vs 1979 FP16 TFLOPS)")},
}
SUBGRAPH_NODES_NOTE = 8  # the larger branch of the subgraph micro-benchmark (host_kernels.SUBGRAPH_NODES), for the sources
#: Precisions a runtime computes in when the table has no figure of their own.
COMPUTE_FALLBACK = {"int4": "int8", "int8-dynamic": "int8", "mxfp8": "fp8", "mxfp4": "nvfp4", "fp8": "fp16", "bf16": "fp16",
                    "nvfp4": "fp8", "fp16": "fp32", "int8": "fp32"}  # fmt: skip
#: Engines in the order an estimate picks them when the target has figures for several.
#: The CPU comes last: it is the fallback that runs what the accelerator cannot.
ENGINE_ORDER = ("gpu", "npu", "dla", "total", "cpu")


@dataclass(frozen=True)
class Hardware:
    """Peak ops/s per precision and bytes/s of one engine of a target at one power mode."""

    target: str
    engine: str
    power_mode: str | None
    peak_ops: dict[str, float]  # precision -> ops/s (dense)
    bandwidth_bytes_s: float | None  # None: no figure, memory traffic is not timed (a lower bound)
    watts: float | None
    sources: tuple[str, ...] = field(default=())  # how each figure was obtained
    cache_bytes: float | None = None  # a node moving no more than this runs at cache_bandwidth_bytes_s (measured hosts)
    cache_bandwidth_bytes_s: float | None = None
    fallback: Hardware | None = None  # the engine that runs what this one cannot (the CPU execution provider)
    fp32_runs_as: str | None = None  # an NPU that compiles FP32 layers to this precision
    node_overhead_us: float | None = None  # measured per-node dispatch overhead (measured hosts)
    large_peak_ops: dict[str, float] | None = None  # the peak of nodes moving more than cache_bytes (measured hosts)
    kernel_efficiency: dict[str, list[list[float]]] | None = None  # kind -> [[roofline s, efficiency]] (host_kernels)
    subgraph_overhead_us: float | None = None  # measured cost of one If's subgraph invocation (measured hosts)
    subgraph_node_us: float | None = None  # measured extra cost of a node run inside a subgraph (measured hosts)
    parallel_sync_us: float | None = None  # measured cost of splitting one node over the intra-op pool (measured hosts)
    layer_model: str = "per-node"  # "tensorrt": the graph is timed as TensorRT's fused layers (tensorrt_layers)
    gpu_cuda_cores: int | None = None  # the GPU's CUDA cores (its SMs: 128 a piece on Ampere and Hopper), for tile waves

    def resolve(self, precision: str) -> tuple[float, str, Hardware]:
        """(ops/s, the precision whose figure it is, the engine that runs it): this engine following
        :data:`COMPUTE_FALLBACK` (FP32 as ``fp32_runs_as`` first), else the fallback engine."""
        seen = self.fp32_runs_as if precision == "fp32" and self.fp32_runs_as else precision
        while seen not in self.peak_ops and seen in COMPUTE_FALLBACK:
            seen = COMPUTE_FALLBACK[seen]
        if seen in self.peak_ops:
            return self.peak_ops[seen], seen, self
        if self.fallback is not None:
            peak, used, _ = self.fallback.resolve(precision)
            return peak, used, self.fallback
        raise EstimateError(f"target '{self.target}' has no peak figure for {precision} on its {self.engine} (nor a fallback engine)",
                            hint=f"add a peak_throughput entry for it (or engine: cpu figures for the CPU fallback) to targets/{self.target}.yaml")  # fmt: skip

    def peak_for(self, precision: str) -> tuple[float, str]:
        """(ops/s, the precision whose figure it is) on whichever engine runs ``precision``."""
        peak, used, _ = self.resolve(precision)
        return peak, used

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "engine": self.engine, "power_mode": self.power_mode,
                "peak_ops_per_s": self.peak_ops, "bandwidth_bytes_per_s": self.bandwidth_bytes_s, "watts": self.watts,
                "cache_bytes": self.cache_bytes, "cache_bandwidth_bytes_per_s": self.cache_bandwidth_bytes_s,
                "sources": list(self.sources), "fp32_runs_as": self.fp32_runs_as, "node_overhead_us": self.node_overhead_us,
                "large_peak_ops_per_s": self.large_peak_ops, "kernel_efficiency": self.kernel_efficiency,
                "subgraph_overhead_us": self.subgraph_overhead_us, "subgraph_node_us": self.subgraph_node_us,
                "fallback": self.fallback.to_json() if self.fallback is not None else None}  # fmt: skip


def needs_measured_peak(target: TargetProfile) -> bool:
    """A target without vendor peaks that describes this host (``cpu.isa: host``) is timed from a measured peak."""
    return not target.peak_throughput and target.cpu.isa == "host"


def _mode(target: TargetProfile, power_mode: str | None) -> str | None:
    if power_mode is None:
        if not target.power_modes:
            return None
        quoted = [p.power_mode for p in target.peak_throughput if p.power_mode]
        return quoted[0] if quoted else max(target.power_modes, key=lambda m: target.power_modes[m])
    if power_mode not in target.power_modes:
        raise EstimateError(f"target '{target.name}' has no power mode '{power_mode}'",
                            hint=f"its modes: {', '.join(target.power_modes) or 'none (leave --power-mode out)'}")  # fmt: skip
    return power_mode


def hardware_for(target: TargetProfile, power_mode: str | None = None, *, measured: Mapping[str, Any] | None = None) -> Hardware:
    """The roofline figures of ``target`` at ``power_mode`` (default: the mode its peak is quoted at).

    ``measured`` (from :func:`edgekit.estimate.host_peak.measure_host_peak`) supplies ``peak_ops`` and
    ``bandwidth_bytes_s`` for targets without vendor figures, and wins over them when given."""
    mode = _mode(target, power_mode)
    watts = target.power_modes.get(mode) if mode else None
    sources: list[str] = []
    if measured is not None:
        measured_peaks = {str(k): float(v) for k, v in measured["peak_ops"].items()}
        sources.append(f"peak and bandwidth measured on this host ({measured.get('method', 'micro-benchmark')})")
        cache, cache_bw = measured.get("cache_bytes"), measured.get("cache_bandwidth_bytes_s")
        if cache and cache_bw:
            sources.append(f"nodes moving at most {cache / 2**20:g} MiB (the L2 cache) at the measured in-cache "
                           f"bandwidth {cache_bw / 1e9:.0f} GB/s")  # fmt: skip
        large = {str(k): float(v) for k, v in (measured.get("large_peak_ops") or {}).items()} if cache and cache_bw else {}
        if large:
            sources.append(f"nodes moving more than the L2 computed at the measured out-of-cache GEMM peak "
                           f"({', '.join(f'{k} {v / 1e9:.0f} G/s' for k, v in sorted(large.items()))})")  # fmt: skip
        overhead = measured.get("node_overhead_us")
        if overhead:
            sources.append(f"per-node dispatch overhead {overhead:.2f} us measured on this host (a chain of tiny nodes)")
        kernels = measured.get("kernel_efficiency") or None
        if kernels:
            sources.append("share of the roofline per node kind measured on this host (ONNX Runtime's kernels on synthetic nodes): "
                           + ", ".join(f"{k} {'..'.join(f'{p[1]:.2f}' for p in v)}" for k, v in sorted(kernels.items())))  # fmt: skip
        subgraph, inside = measured.get("subgraph_overhead_us"), measured.get("subgraph_node_us")
        if subgraph is not None:
            sources.append(f"If subgraph invocation {subgraph:.1f} us measured on this host (a chain of Ifs against the same nodes without)"
                           + (f", and {inside:.2f} us more for each node run inside a subgraph (branches of 1 and "
                              f"{SUBGRAPH_NODES_NOTE} nodes)" if inside is not None else ""))  # fmt: skip
        sync = measured.get("parallel_sync_us")
        if sync is not None:
            sources.append(f"split across the intra-op threads: {sync:.1f} us a node measured on this host (small MatMuls "
                           "on all threads against one thread)")
        return Hardware(target.name, "cpu", mode, measured_peaks, float(measured["bandwidth_bytes_s"]), watts, tuple(sources),
                        float(cache) if cache and cache_bw else None, float(cache_bw) if cache and cache_bw else None,
                        node_overhead_us=float(overhead) if overhead else None, large_peak_ops=large or None,
                        kernel_efficiency=kernels, subgraph_overhead_us=float(subgraph) if subgraph is not None else None,
                        subgraph_node_us=float(inside) if inside is not None else None,
                        parallel_sync_us=float(sync) if sync is not None else None)  # fmt: skip
    if not target.peak_throughput:
        raise EstimateError(f"target '{target.name}' has no peak_throughput figures to estimate from",
                            hint="on the device itself, pass --measure-host to measure its peak (GEMM and copy micro-benchmark); "
                                 f"or add vendor figures with sources to targets/{target.name}.yaml")  # fmt: skip
    engines = {p.engine for p in target.peak_throughput}
    engine = next(e for e in ENGINE_ORDER if e in engines)
    projected = openvino_projection(target, engine)
    if projected:
        sources.append(projected)
    peaks, peak_sources = _engine_peaks(target, engine, mode)
    sources.extend(peak_sources)
    bandwidth = None
    if target.gpu is not None and target.gpu.memory_bandwidth_gbps and engine == "gpu":
        bandwidth, where = target.gpu.memory_bandwidth_gbps, "gpu.memory_bandwidth_gbps"
    elif target.memory.bandwidth_gbps:
        bandwidth, where = target.memory.bandwidth_gbps, "memory.bandwidth_gbps"
    if bandwidth is None:
        sources.append("NO memory bandwidth figure in the target profile: memory traffic is not timed, so this estimate "
                       f"is a LOWER BOUND (add memory.bandwidth_gbps with its source to targets/{target.name}.yaml)")  # fmt: skip
    else:
        sources.append(f"bandwidth {bandwidth:g} GB/s from the target's {where}")
    fallback = None
    if engine != "cpu" and "cpu" in engines:
        cpu_peaks, cpu_sources = _engine_peaks(target, "cpu", mode)
        cpu_bandwidth = target.memory.bandwidth_gbps
        fallback = Hardware(target.name, "cpu", mode, cpu_peaks, cpu_bandwidth * 1e9 if cpu_bandwidth else None, watts,
                            tuple(cpu_sources) + ((f"cpu bandwidth {cpu_bandwidth:g} GB/s from memory.bandwidth_gbps",) if cpu_bandwidth else ()))  # fmt: skip
    fp32_as = target.npu.fp32_runs_as.value if engine == "npu" and target.npu is not None and target.npu.fp32_runs_as else None
    if fp32_as:
        sources.append(f"fp32 layers run as {fp32_as} on the {target.npu.name} (npu.fp32_runs_as)")  # type: ignore[union-attr]
    layer_model = "tensorrt" if engine in ("gpu", "total") and target.backends[0].name == "tensorrt" else "per-node"
    if layer_model == "tensorrt":
        sources.append("timed as TensorRT layers: the target's preferred backend is tensorrt (backends[0])")
    return Hardware(target.name, engine, mode, peaks, bandwidth * 1e9 if bandwidth else None, watts, tuple(sources),
                    fallback=fallback, fp32_runs_as=fp32_as, layer_model=layer_model,
                    gpu_cuda_cores=target.gpu.cuda_cores if target.gpu is not None else None)  # fmt: skip


def openvino_projection(target: TargetProfile, engine: str) -> str | None:
    """The label of an estimate for an Intel GPU or NPU that OpenVINO reaches: edgekit has timed no bundle on one,
    and a build host without the device measures the CPU plugin standing in, so the figures are a projection."""
    devices = {b.device for b in target.backends if b.device in ("GPU", "NPU")}
    if engine not in ("gpu", "npu") or engine.upper() not in devices:
        return None
    return (f"PROJECTED for the OpenVINO {engine.upper()} device: from the target's vendor figures and derivations only; edgekit "
            f"has timed no bundle on this {engine.upper()}, and a build host without it measures the CPU plugin standing in "
            "(manifest backend.openvino.host_stand_in)")


def _engine_peaks(target: TargetProfile, engine: str, mode: str | None) -> tuple[dict[str, float], list[str]]:
    """Peak ops/s per precision of one engine at ``mode``, with the derivation rules above, and their sources.

    A figure quoted at ``mode`` itself is used as quoted; only a precision with no figure at ``mode`` is scaled from
    the figures of other modes by the watts ratio (clocks, hence peaks, fall faster than watts at low modes: the
    AGX Orin's GPU gives 41 sparse INT8 TOPS at 30 W, not half its 171 at 60 W)."""
    sources: list[str] = []
    peaks: dict[str, float] = {}
    entries = [peak for peak in target.peak_throughput if peak.engine == engine]
    quoted_here = {peak.precision for peak in entries if mode and peak.power_mode == mode}
    for peak in entries:
        if peak.precision in quoted_here and peak.power_mode != mode:
            continue  # a figure quoted at this very mode wins over any figure scaled from another one
        value = peak.value * 1e12 * (0.5 if peak.sparse else 1.0)
        note = f"{peak.precision.value}: {peak.value:g} {peak.unit} ({'sparse, counted half' if peak.sparse else 'dense'})"
        if peak.power_mode and mode and peak.power_mode != mode:
            ratio = target.power_modes[mode] / target.power_modes[peak.power_mode]
            value *= ratio
            note += f" quoted at {peak.power_mode}, scaled by the watts ratio {ratio:.2f} to {mode} (no figure quoted at {mode})"
        elif peak.power_mode:
            note += f" quoted at {peak.power_mode}, used as quoted"
        if peak.derivation:
            note += f"; derived: {peak.derivation}"
        if value > peaks.get(peak.precision.value, 0.0):
            peaks[peak.precision.value] = value
            sources.append(f"target peak_throughput {engine} {note}")
    gpu = target.gpu if engine in ("gpu", "total") else None
    if "fp32" not in peaks and gpu is not None and gpu.cuda_cores and gpu.max_clock_mhz:
        value = gpu.cuda_cores * 2.0 * gpu.max_clock_mhz * 1e6  # one FMA (2 FLOPs) per CUDA core per clock
        note = f"fp32 from the target's GPU: {gpu.cuda_cores} CUDA cores x 2 x {gpu.max_clock_mhz:g} MHz"
        quoted = next((p.power_mode for p in target.peak_throughput if p.power_mode), None)
        if quoted and mode and quoted != mode:
            ratio = target.power_modes[mode] / target.power_modes[quoted]
            value *= ratio
            note += f", clock taken at {quoted} and scaled by the watts ratio {ratio:.2f} to {mode}"
        peaks["fp32"] = value
        sources.append(note)
    arch = gpu.architecture if gpu is not None else None
    base = peaks.get("int8") if arch != "blackwell" else peaks.get("fp8")
    for precision, (ratio, why) in DERIVATIONS.get(arch or "", {}).items():
        if precision not in peaks and base:
            peaks[precision] = base * ratio
            sources.append(f"{precision} derived: {why}")
    return peaks, sources
