"""Benchmark a bundle on this host; with ``vs_pytorch`` the PyTorch eager model runs on the same
inputs, interleaved in rounds so that machine noise hits both alike."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.data import fit_batch
from edgekit.errors import EdgekitError
from edgekit.quantize import float_writers
from edgekit_runtime.bundle import Bundle, open_bundle
from edgekit_runtime.signature import IOSignature
from edgekit_runtime.timing import LatencyStats, time_calls

#: Bundle precisions whose graph ONNX Runtime's CPU provider cannot run (see ``edgekit.quantize.float_writers``).
DEVICE_ONLY_FORMATS = tuple(precision.value for precision in float_writers.WRITTEN)


@dataclass(frozen=True)
class BenchReport:
    bundle: str
    dims: dict[str, int]
    batch: int
    threads: int
    iterations: int
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    device: str = "cpu"
    providers: list[str] = field(default_factory=list)  # what the bundle variants ran on, as ONNX Runtime reports it
    energy_note: str | None = None  # why variants have no ``energy`` (GPU runs without NVML's energy counter)
    notes: list[str] = field(default_factory=list)  # variants that could not run, and why
    host_cpu: str | None = None  # this host's processor, where the variants ran
    target: str | None = None  # the bundle's target (display name), when it is another device than this host
    graph_note: str | None = None  # what was timed when it is not what the device runs (a TensorRT bundle's ONNX graph)

    def to_json(self) -> dict[str, Any]:
        return {"bundle": self.bundle, "dims": self.dims, "batch": self.batch, "threads": self.threads, "iterations": self.iterations,
                "device": self.device, "providers": self.providers, "host_cpu": self.host_cpu,
                "measured_on_target": self.target is None, "target": self.target, "variants": self.variants,
                **({"graph_note": self.graph_note} if self.graph_note else {}),
                **({"energy_note": self.energy_note} if self.energy_note else {}), **({"notes": self.notes} if self.notes else {})}  # fmt: skip


def round_sizes(iterations: int, rounds: int) -> list[int]:
    """Timed calls per interleaved round, ``iterations`` in all (7 in 5 rounds: 2, 2, 1, 1, 1; 3: three rounds of 1)."""
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise EdgekitError(f"--iterations must be 1 or more, not {iterations!r}", hint="pass --iterations N with N >= 1, e.g. --iterations 50")
    count = max(1, min(rounds, iterations))
    return [iterations // count + (1 if index < iterations % count else 0) for index in range(count)]


def timed_graph_note(manifest: dict[str, Any]) -> str | None:
    """What a host run of the bundle times when that is not what its device runs: a TensorRT bundle's ONNX graph on ONNX
    Runtime's CPU provider, the FP32 graph when TensorRT applies the precision through builder flags on the device."""
    backend: Any = manifest.get("backend")
    backend = backend if isinstance(backend, dict) else {}
    trt: Any = backend.get("tensorrt")
    if backend.get("name") != "tensorrt" and not isinstance(trt, dict):
        return None
    precision = manifest.get("precision")
    if isinstance(trt, dict) and trt.get("onnx_precision") == "as-exported" and precision not in (None, "fp32"):
        return f"FP32 graph on ONNX Runtime CPU; the device applies {precision} (TensorRT builder flags), so its latency differs"
    return "the bundle's ONNX graph on ONNX Runtime CPU; the device runs it as a TensorRT engine, so its latency differs"


def _other_target(manifest: dict[str, Any]) -> str | None:
    """The bundle's target when it is another device than the host running it (not a ``cpu.isa: host`` profile)."""
    from edgekit.report.formatting import measured_on_target

    if measured_on_target(manifest):
        return None
    target: Any = manifest.get("target")
    target = target if isinstance(target, dict) else {}
    return str(target.get("display_name") or target.get("name") or "its target")


def bench_batch(manifest: dict[str, Any], dims: dict[str, int]) -> int:
    """Items per call, counted as the build's benchmark counts them (``benchmark.batch`` in the manifest): the size of the
    named dim at axis 0 of the first input that has one (``Recipe.batch_dim``), 1 when no input starts with a named dim.

    Not the first input's leading size: a fixed axis 0 (``[8, 4096]``) is one item per call to the build, and a first input
    without a batch axis (``scale: [3]`` before ``x: [batch, 16]``) says nothing about the batch."""
    io: Any = manifest.get("io")
    inputs = io.get("inputs") if isinstance(io, dict) else None
    for spec in inputs if isinstance(inputs, list) else []:
        shape = spec.get("shape") if isinstance(spec, dict) else None
        if isinstance(shape, list) and shape and isinstance(shape[0], str):
            size = dims.get(shape[0])
            return size if isinstance(size, int) and not isinstance(size, bool) and size >= 1 else 1
    return 1


def parse_dims(text: str | None) -> dict[str, int]:
    """``"batch=8,seq=128"`` -> ``{"batch": 8, "seq": 128}``."""
    if not text:
        return {}
    dims: dict[str, int] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep or not value.strip().isdigit():
            raise EdgekitError(f"--shape: cannot read '{part}'", hint="write dim=value pairs separated by commas, e.g. --shape batch=8,seq=128")
        if int(value) < 1:
            raise EdgekitError(f"--shape: {name.strip()} must be >= 1, not {int(value)}", hint="a dim is a size: give it 1 or more, e.g. --shape batch=1")
        dims[name.strip()] = int(value)
    return dims


def feeds_at(bundle: Bundle, signature: IOSignature, dims: dict[str, int]) -> dict[str, np.ndarray]:
    """The bundle's first golden input batch, cut or tiled to ``dims`` along its dynamic axes."""
    first = bundle.manifest["golden"]["batches"][0]["inputs"]
    with np.load(bundle.root / first) as npz:
        feeds = {k: npz[k] for k in npz.files}
    return {**feeds, **fit_batch(signature.inputs, feeds, dims)}


def host_runner(bundle: Bundle, signature: IOSignature, threads: int) -> Any:
    """The bundle's ONNX graph on this host's CPU with ONNX Runtime, whatever backend the bundle targets:
    a TensorRT bundle's engine can only run on its device, and host timings are labelled as such. An OpenVINO
    bundle runs with OpenVINO (its device when here, else the CPU plugin).

    Its intra-op threads spin briefly after each run (:data:`DEFAULT_SERVING_SPIN_US`, as the agent serves), not
    for ONNX Runtime's default time: sessions timed in turn in one process (``edgekit sweep``'s variants,
    ``--vs-pytorch``'s PyTorch) would otherwise run while the previous one's threads still spin on the same
    cores. Five digits-cnn variants timed in turn on two cores measured 4.2x slower each that way (fp32 at batch
    64: 6.59 ms against 1.55 ms alone), and their ratios to FP32 were wrong (int8 0.17x, 0.39x alone)."""
    from edgekit_runtime.agent.config_types import DEFAULT_SERVING_SPIN_US
    from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner

    precision = bundle.manifest.get("precision")
    if precision in DEVICE_ONLY_FORMATS:
        raise EdgekitError(
            f"{bundle.root}: a {precision} bundle holds weights ONNX Runtime's CPU provider cannot run (FP8/FP4 DequantizeLinear), "
            "so it cannot be timed on this host",
            hint="time it on its device (edgekit-agent serves it and reports latency); its manifest has the accuracy measured here",
        )
    if bundle.manifest["backend"].get("name") == "openvino":  # its device, or the CPU plugin standing in for it
        from edgekit.engines.openvino import host_runner as openvino_runner

        return openvino_runner(bundle.manifest["backend"]["openvino"], bundle.model_path, signature, threads)
    graph_optimization = bundle.manifest["backend"].get("graph_optimization", "all")
    return OnnxRuntimeRunner(bundle.model_path, signature, execution_providers=[{"name": "CPUExecutionProvider", "options": {}}],
                             graph_optimization=graph_optimization, intra_op_threads=threads,
                             denormal_as_zero=bool(bundle.manifest["backend"].get("denormal_as_zero", False)),
                             intra_op_spinning=True, intra_op_spin_us=DEFAULT_SERVING_SPIN_US).load()


def _torch_model(bundle: Bundle, recipe_path: Path | None, trust_code: bool = False, device: str = "cpu") -> tuple[Any, Any]:
    from edgekit.recipe import load_recipe
    from edgekit.sources import load_source
    from edgekit.torch_reference import TorchReference

    path = Path(recipe_path or bundle.manifest["recipe"]["path"])
    if not path.is_file():
        raise EdgekitError(f"--vs-pytorch needs the bundle's recipe, not found at {path}", hint="pass --recipe PATH")
    recipe = load_recipe(path, trust_code=trust_code).for_target(bundle.manifest["target"]["name"])
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        loaded = load_source(recipe, Path(tmp))
    if loaded.module is None:
        raise EdgekitError(f"{path}: the recipe's source ({loaded.kind}) has no PyTorch model to compare with")
    return TorchReference(loaded.module.to(device), recipe, device=device), recipe


def bench_bundle(bundle_dir: Path, dims: dict[str, int] | None = None, iterations: int = 50, warmup: int = 10, vs_pytorch: bool = False,
                 threads: int | None = None, recipe_path: Path | None = None, rounds: int = 5, trust_code: bool = False,
                 device: str = "cpu") -> BenchReport:
    """Time the bundle on this host's CPU (``device="cpu"``: ONNX Runtime's CPU provider) or NVIDIA GPU
    (``"cuda"``: see :mod:`edgekit.bench.gpu`), in interleaved rounds beside PyTorch eager on the same
    device when ``vs_pytorch``."""
    if device not in ("cpu", "cuda"):
        raise EdgekitError(f"--device {device!r} is not one of cpu, cuda")
    sizes = round_sizes(iterations, rounds)
    bundle = open_bundle(bundle_dir, verify=True)
    signature = IOSignature.from_manifest(bundle.manifest["io"])
    all_dims = {name: rng["opt"] for name, rng in bundle.manifest["io"]["dims"].items()}
    unknown = sorted(set(dims or {}) - set(all_dims))
    if unknown:
        raise EdgekitError(f"--shape names unknown dims {unknown}", hint=f"this bundle's dynamic dims: {sorted(all_dims) or 'none'}")
    all_dims.update(dims or {})
    threads = threads or min(os.cpu_count() or 1, bundle.manifest["target"]["cpu"]["cores"])
    feeds = feeds_at(bundle, signature, all_dims)
    batch = bench_batch(bundle.manifest, all_dims)
    if device == "cuda":
        from edgekit.bench import gpu

        contenders, runners, notes = gpu.cuda_contenders(bundle, signature, feeds)
    else:
        notes = []
        runner = host_runner(bundle, signature, threads)
        runners = [runner]
        contenders = {"bundle": lambda: runner.infer(feeds)}
    try:
        if vs_pytorch:
            import torch

            torch.set_num_threads(threads)
            reference, _ = _torch_model(bundle, recipe_path, trust_code, device)
            contenders["pytorch_eager"] = lambda: reference(feeds)
        samples: dict[str, list[float]] = {name: [] for name in contenders}
        for index, size in enumerate(sizes):
            for name, fn in contenders.items():
                samples[name] += time_calls(fn, warmup if index == 0 else 1, size)
        energy: dict[str, Any] | str = {}
        if device == "cuda":
            energy = gpu.energy_per_inference(contenders, batch)
        providers = list(runners[0].providers)
    finally:
        for runner in runners:
            runner.close()
    variants = {}
    for name, values in samples.items():
        stats = LatencyStats.from_samples(values)
        variants[name] = {**stats.to_dict(), "throughput_per_s": batch * 1000.0 / stats.mean_ms}
        if isinstance(energy, dict) and name in energy:
            variants[name]["energy"] = energy[name]
    if vs_pytorch:
        variants["bundle"]["ratio_vs_pytorch_p50"] = variants["bundle"]["p50_ms"] / variants["pytorch_eager"]["p50_ms"]
    from edgekit.bundle.manifest import host_description

    return BenchReport(bundle=str(bundle_dir), dims=all_dims, batch=batch, threads=threads, iterations=sum(sizes), variants=variants,
                       device=device, providers=providers, energy_note=energy if isinstance(energy, str) else None, notes=notes,
                       host_cpu=str(host_description()["cpu"]), target=_other_target(bundle.manifest),
                       graph_note=timed_graph_note(bundle.manifest) if device == "cpu" else None)  # fmt: skip


def time_bundles_interleaved(bundle_dirs: list[Path], iterations: int = 30, rounds: int = 5, threads: int | None = None,
                             dims: dict[str, int] | None = None) -> dict[str, dict[str, float]]:
    """p50/p99 of several bundles at the shape each was benchmarked at (or ``dims``), timed in
    interleaved rounds on this host's CPU so that noise hits them alike; keyed by ``str(bundle_dir)``."""
    sizes = round_sizes(iterations, rounds)
    contenders = {}
    runners = []
    try:
        for bundle_dir in bundle_dirs:
            bundle = open_bundle(bundle_dir, verify=True)
            signature = IOSignature.from_manifest(bundle.manifest["io"])
            shape = dims or bundle.manifest["benchmark"]["shape"]
            feeds = feeds_at(bundle, signature, shape)
            count = threads or bundle.manifest["benchmark"].get("threads") or os.cpu_count() or 1
            runner = host_runner(bundle, signature, count)
            runners.append(runner)
            contenders[str(bundle_dir)] = (runner, feeds)
        samples: dict[str, list[float]] = {name: [] for name in contenders}
        for index, size in enumerate(sizes):
            for name, (runner, feeds) in contenders.items():
                samples[name] += time_calls(lambda r=runner, f=feeds: r.infer(f, validate=False), 2 if index == 0 else 0, size)
    finally:
        for runner in runners:
            runner.close()
    return {name: LatencyStats.from_samples(values).to_dict() for name, values in samples.items()}
