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
    "blackwell": {"fp16": (0.5, "Blackwell tensor cores: FP16 at half the FP8 rate")},
}
#: Precisions a runtime computes in when the table has no figure of their own.
COMPUTE_FALLBACK = {"int4": "int8", "int8-dynamic": "int8", "mxfp8": "fp8", "mxfp4": "nvfp4", "fp8": "fp16", "bf16": "fp16",
                    "nvfp4": "fp8", "fp16": "fp32", "int8": "fp32"}  # fmt: skip
#: Engines in the order an estimate picks them when the target has figures for several.
ENGINE_ORDER = ("gpu", "npu", "dla", "cpu", "total")


@dataclass(frozen=True)
class Hardware:
    """Peak ops/s per precision and bytes/s of one engine of a target at one power mode."""

    target: str
    engine: str
    power_mode: str | None
    peak_ops: dict[str, float]  # precision -> ops/s (dense)
    bandwidth_bytes_s: float
    watts: float | None
    sources: tuple[str, ...] = field(default=())  # how each figure was obtained
    cache_bytes: float | None = None  # a node moving no more than this runs at cache_bandwidth_bytes_s (measured hosts)
    cache_bandwidth_bytes_s: float | None = None

    def peak_for(self, precision: str) -> tuple[float, str]:
        """(ops/s, the precision whose figure it is) following :data:`COMPUTE_FALLBACK` where needed."""
        seen = precision
        while seen not in self.peak_ops:
            if seen not in COMPUTE_FALLBACK:
                raise EstimateError(f"target '{self.target}' has no peak figure for {precision} (nor a fallback)",
                                    hint=f"add a peak_throughput entry for it to targets/{self.target}.yaml")  # fmt: skip
            seen = COMPUTE_FALLBACK[seen]
        return self.peak_ops[seen], seen

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "engine": self.engine, "power_mode": self.power_mode,
                "peak_ops_per_s": self.peak_ops, "bandwidth_bytes_per_s": self.bandwidth_bytes_s, "watts": self.watts,
                "cache_bytes": self.cache_bytes, "cache_bandwidth_bytes_per_s": self.cache_bandwidth_bytes_s,
                "sources": list(self.sources)}  # fmt: skip


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
        return Hardware(target.name, "cpu", mode, measured_peaks, float(measured["bandwidth_bytes_s"]), watts, tuple(sources),
                        float(cache) if cache and cache_bw else None, float(cache_bw) if cache and cache_bw else None)  # fmt: skip
    if not target.peak_throughput:
        raise EstimateError(f"target '{target.name}' has no peak_throughput figures to estimate from",
                            hint="on the device itself, pass --measure-host to measure its peak (GEMM and copy micro-benchmark); "
                                 f"or add vendor figures with sources to targets/{target.name}.yaml")  # fmt: skip
    engines = {p.engine for p in target.peak_throughput}
    engine = next(e for e in ENGINE_ORDER if e in engines)
    peaks: dict[str, float] = {}
    for peak in target.peak_throughput:
        if peak.engine != engine:
            continue
        value = peak.value * 1e12 * (0.5 if peak.sparse else 1.0)
        note = f"{peak.precision.value}: {peak.value:g} {peak.unit} ({'sparse, counted half' if peak.sparse else 'dense'})"
        if peak.power_mode and mode and peak.power_mode != mode:
            ratio = target.power_modes[mode] / target.power_modes[peak.power_mode]
            value *= ratio
            note += f" quoted at {peak.power_mode}, scaled by the watts ratio {ratio:.2f} to {mode}"
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
    bandwidth = None
    if target.gpu is not None and target.gpu.memory_bandwidth_gbps and engine == "gpu":
        bandwidth, where = target.gpu.memory_bandwidth_gbps, "gpu.memory_bandwidth_gbps"
    elif target.memory.bandwidth_gbps:
        bandwidth, where = target.memory.bandwidth_gbps, "memory.bandwidth_gbps"
    if bandwidth is None:
        raise EstimateError(f"target '{target.name}' has no memory bandwidth figure",
                            hint=f"add memory.bandwidth_gbps with its source to targets/{target.name}.yaml")  # fmt: skip
    sources.append(f"bandwidth {bandwidth:g} GB/s from the target's {where}")
    return Hardware(target.name, engine, mode, peaks, bandwidth * 1e9, watts, tuple(sources))
