#!/usr/bin/env python3
"""GPU baseline, ONNX Runtime beside PyTorch: onnxruntime-gpu's CUDA provider and PyTorch timed in one run
on the same GPU, the same models, shapes and inputs (scripts/gpu_baseline.py's cases).

For each case and precision (FP32; FP16 = PyTorch ``module.half()`` / the ONNX graph converted by edgekit's
``convert_fp16``, whose inputs and outputs stay FP32):
  - torch-eager, torch-graph: the module called from Python / replayed as a torch.cuda.CUDAGraph, inputs
    and outputs on the GPU;
  - ort-cuda: edgekit's runtime path (edgekit_runtime.backends.ort_device_io.DeviceBinding over an
    InferenceSession on the CUDA provider): numpy in, numpy out, as the agent serves a request;
  - ort-cuda-device-io: the same binding with inputs already on the GPU and outputs left there;
  - ort-cuda-graph: as ort-cuda-device-io with the CUDA provider's ``enable_cuda_graph`` (one replay a call).
Every call is timed with the host's clock around the call and a device synchronisation after it (ONNX
Runtime synchronises at the end of a run), so all rows measure the same thing: the latency a caller sees.
Each row also carries the cosine of its output to PyTorch FP32 (a broken run cannot pass as fast) and,
for each model's largest batch, the energy per inference from NVML's board energy counter.

    python scripts/gpu_baseline_ort.py time [--out FILE.json] [--models a,b] [--iterations N]
    python scripts/gpu_baseline_ort.py compare MEASURED.json DIR --target nvidia-h100   # vs edgekit estimate
    python scripts/gpu_baseline_ort.py time --cpu-dry-run --models digits-cnn --out /tmp/dry.json
        # the same code on the CPU (PyTorch eager, ONNX Runtime's CPU provider through the same binding),
        # to check the script before spending GPU time; its numbers are not a baseline

It exits 2 without a CUDA device or without onnxruntime-gpu's CUDA provider, and writes nothing then.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_baseline as base  # noqa: E402  (the cases, models and inputs)

REPO = base.REPO
sys.path[:0] = [str(REPO), str(REPO / "runtime")]
TORCH_METHODS = ("torch-eager", "torch-graph")
ORT_METHODS = ("ort-cuda", "ort-cuda-device-io", "ort-cuda-graph")
METHODS = TORCH_METHODS + ORT_METHODS


class Platform:
    """Where the run goes: the GPU (the baseline), or the CPU for --cpu-dry-run (same code, no graphs)."""

    def __init__(self, dry_run: bool) -> None:
        import torch

        self.dry_run = dry_run
        self.torch_device = "cpu" if dry_run else "cuda"
        self.provider = "CPUExecutionProvider" if dry_run else "CUDAExecutionProvider"
        self.ort_device = "cpu" if dry_run else "cuda"
        self.torch_methods = ("torch-eager",) if dry_run else TORCH_METHODS
        self.sync: Callable[[], None] = (lambda: None) if dry_run else torch.cuda.synchronize


def wall_ms(call: Callable[[], Any], sync: Callable[[], None], iterations: int) -> list[float]:
    samples = []
    for _ in range(iterations):
        started = time.perf_counter()
        call()
        sync()
        samples.append((time.perf_counter() - started) * 1000.0)
    return samples


def energy_of(call: Callable[[], Any], sync: Callable[[], None], seconds: float, batch: int) -> dict[str, Any] | None:
    """NVML board energy per call over ``seconds`` of back-to-back calls (edgekit's NVML sensor)."""
    from edgekit_runtime.sensors.nvml import NvmlPowerSensor

    with NvmlPowerSensor(device_indices=[0]) as sensor:
        if not sensor.available() or sensor.read().energy_mj is None:
            return None
        sync()
        before, calls, started = sensor.read(), 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            call()
            calls += 1
        sync()
        after = sensor.read()
    joules = (after.energy_mj - before.energy_mj) / 1000.0  # type: ignore[operator]
    elapsed = after.timestamp_s - before.timestamp_s
    return {"mj_per_inference": round(1000 * joules / calls, 4), "mj_per_item": round(1000 * joules / (calls * batch), 5),
            "mean_w": round(joules / elapsed, 1), "calls": calls, "seconds": round(elapsed, 2)}  # fmt: skip


def cosine_to(reference: Any, output: Any) -> float:
    import numpy as np

    a = np.asarray(reference, dtype=np.float64).reshape(len(reference), -1)
    b = np.asarray(output, dtype=np.float64).reshape(len(output), -1)
    return float(((a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)).min())


def onnx_files(model: str, folder: Path) -> dict[str, Path]:
    """FP32 ONNX (gpu_baseline's export) and its FP16 conversion by edgekit's engine build."""
    import onnx

    from edgekit.engines.onnxruntime import convert_fp16

    try:
        fp32 = base.export_onnx(model, folder)
    except Exception as error:  # noqa: BLE001 -- e.g. a transformers release the TorchScript exporter cannot trace
        print(f"{model}: TorchScript export failed ({type(error).__name__}: {str(error)[:200]}); trying torch.export (dynamo=True)", flush=True)
        fp32 = export_dynamo(model, folder)
    fp16 = folder / f"{model}.fp16.onnx"
    onnx.save(convert_fp16(onnx.load(str(fp32))), str(fp16))
    return {"fp32": fp32, "fp16": fp16}


def export_dynamo(name: str, folder: Path) -> Path:
    """As gpu_baseline.export_onnx, through torch.export (the exporter newer PyTorch releases default to)."""
    import torch

    module = base.build_model(name)
    case = next(case for case in base.CASES if case.model == name)
    axes = {n: {0: "batch", 1: "seq"} if name == "minilm" else {0: "batch"} for n in base.INPUT_NAMES[name]}
    path = folder / f"{name}.onnx"
    with torch.inference_mode():
        torch.onnx.export(module, tuple(base.example_inputs(case)), str(path), input_names=base.INPUT_NAMES[name],
                          output_names=base.OUTPUT_NAMES[name], dynamic_axes=axes, opset_version=18, dynamo=True)  # fmt: skip
    return path


def ort_bindings(path: Path, output_names: list[str], platform: Platform) -> dict[str, Any]:
    """One binding (edgekit's DeviceBinding) per session kind on the platform's provider: plain, and with
    enable_cuda_graph, which a model with nodes left on the CPU cannot have (then: the reason, a string).
    TF32 is off as in the PyTorch rows (use_tf32 0: FP32 means FP32)."""
    import onnxruntime as ort

    from edgekit_runtime.backends.ort_device_io import DeviceBinding

    def binding(options: dict[str, str], cuda_graph: bool) -> Any:
        provider = (platform.provider, {"device_id": "0", "use_tf32": "0", **options} if platform.provider == "CUDAExecutionProvider" else {})
        made = ort.InferenceSession(str(path), providers=[provider, "CPUExecutionProvider"])
        if made.get_providers()[0] != platform.provider:
            raise RuntimeError(f"{path.name}: the {platform.provider} did not load (providers {made.get_providers()})")
        return DeviceBinding(ort, made, output_names, device=platform.ort_device, cuda_graph=cuda_graph)

    bindings: dict[str, Any] = {"plain": binding({}, False)}
    try:
        bindings["graph"] = binding({"enable_cuda_graph": "1"}, not platform.dry_run)
    except Exception as error:  # noqa: BLE001 -- ONNX Runtime refuses capture for this graph: no graph rows, say why
        bindings["graph"] = f"{type(error).__name__}: {str(error)[:300]}"
        print(f"{path.name}: no CUDA graph rows: {bindings['graph']}", flush=True)
    return bindings


def ort_calls(bindings: dict[str, Any], feeds: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    plain, graph = bindings["plain"], bindings["graph"]
    calls = {"ort-cuda": lambda: plain.run(feeds), "ort-cuda-device-io": plain.resident_call(feeds)}
    if not isinstance(graph, str):
        graph.run(feeds)  # learns the output shapes, fixes the buffers, gives the shape its own graph id
        calls["ort-cuda-graph"] = graph.resident_call(feeds)
    return calls


def host_output(method: str, result: Any) -> Any:
    """The first output as numpy, whatever the method returned (torch tensor, numpy, OrtValue list)."""
    import onnxruntime as ort

    if method.startswith("torch"):
        return result.float().cpu().numpy()
    first = result[0]
    return first.numpy() if isinstance(first, ort.OrtValue) else first


def time_model(model: str, cases: list[base.Case], args: argparse.Namespace, folder: Path, device: dict[str, str],
               on_row: Callable[[dict[str, Any]], None], platform: Platform) -> None:  # fmt: skip
    import torch

    where, sync = platform.torch_device, platform.sync
    files = onnx_files(model, folder)
    largest = max(case.batch for case in cases)
    for precision in ("fp32", "fp16"):
        module = base.build_model(model).to(where)
        if precision == "fp16":
            module = module.half()
        bindings = ort_bindings(files[precision], base.OUTPUT_NAMES[model], platform)
        for case in cases:
            inputs = [t.to(where) for t in base.example_inputs(case)]
            torch_inputs = [t.half() if precision == "fp16" and t.is_floating_point() else t for t in inputs]
            feeds = {name: t.cpu().numpy() for name, t in zip(base.INPUT_NAMES[model], inputs)}  # ORT: FP32 in, either way
            with torch.inference_mode():
                reference = base.first_output(base.build_model(model).to(where)(*inputs)).float().cpu().numpy() if precision == "fp16" else None
            calls: dict[str, Callable[[], Any]] = {}
            for method in platform.torch_methods:
                try:
                    calls[method] = torch_call(module, torch_inputs, method, args.warmup, platform)
                except Exception as error:  # noqa: BLE001 -- e.g. MiniLM refuses graph capture: no row, say why
                    print(f"{model:<13} {case.label:<16} {precision} {method:<19} FAILED {type(error).__name__}: {error}"[:300], flush=True)
                    sync()
            calls.update(ort_calls(bindings, feeds))
            if reference is None:
                reference = host_output("torch-eager", calls["torch-eager"]())
            for method, call in calls.items():
                for _ in range(args.warmup):
                    call()
                sync()
                samples = wall_ms(call, sync, args.iterations)
                wanted = case.batch == largest and args.energy_s > 0 and not platform.dry_run
                energy = energy_of(call, sync, args.energy_s, case.batch) if wanted else None
                row = {"model": model, "precision": precision, "batch": case.batch, "dims": dict(case.dims), "method": method,
                       "p50_ms": round(statistics.median(samples), 5), "p90_ms": round(base.percentile(samples, 90), 5),
                       "min_ms": round(min(samples), 5), "count": len(samples),
                       "cosine_to_torch_fp32": round(cosine_to(reference, host_output(method, call())), 6), "energy": energy, **device}  # fmt: skip
                on_row(row)
                watts = f"  {energy['mj_per_inference']:8.3f} mJ/inf {energy['mean_w']:5.0f} W" if energy else ""
                print(f"{model:<13} {case.label:<16} {precision} {method:<19} p50 {row['p50_ms']:9.4f} ms  cos {row['cosine_to_torch_fp32']:.5f}{watts}", flush=True)
        del module, bindings
        if not platform.dry_run:
            torch.cuda.empty_cache()


def torch_call(module: Any, inputs: list[Any], method: str, warmup: int, platform: Platform) -> Callable[[], Any]:
    if not platform.dry_run:
        return base.runner(module, inputs, method.removeprefix("torch-"), warmup)
    import torch

    def eager() -> Any:
        with torch.inference_mode():
            return base.first_output(module(*inputs))

    return eager


def cmd_time(args: argparse.Namespace) -> int:
    import torch

    platform = Platform(args.cpu_dry_run)
    if not platform.dry_run and not torch.cuda.is_available():
        sys.stderr.write("gpu_baseline_ort: no CUDA device visible to torch; nothing measured, nothing written\n")
        return 2
    import onnxruntime as ort

    if not platform.dry_run and "CUDAExecutionProvider" not in ort.get_available_providers():
        sys.stderr.write(f"gpu_baseline_ort: onnxruntime {ort.__version__} has no CUDAExecutionProvider "
                         f"({ort.get_available_providers()}); install onnxruntime-gpu. Nothing written\n")  # fmt: skip
        return 2
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if platform.dry_run:
        if args.out is None:
            raise SystemExit("gpu_baseline_ort: --cpu-dry-run needs --out (its numbers are not a baseline for docs/)")
        device = {"gpu": "none (--cpu-dry-run)", "driver": "-", "torch": torch.__version__, "cuda": "-", "onnxruntime": ort.__version__}
    else:
        device = {**base.device_info(), "onnxruntime": ort.__version__}
    out = args.out or REPO / "docs" / "benchmarks" / base.default_out(device["gpu"]).name.replace("gpu_baseline_", "gpu_ort_")
    meta = {"benchmark": "onnxruntime-gpu CUDA provider beside PyTorch on one GPU, one run" if not platform.dry_run else "CPU dry run of the script (not a baseline)",
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), **device,
            "available_providers": ort.get_available_providers(),
            "timing": {"method": "host clock around each call + torch.cuda.synchronize(); p50 of the calls", "warmup": args.warmup,
                       "iterations": args.iterations, "tf32": False, "energy_window_s": args.energy_s}}  # fmt: skip
    rows: list[dict[str, Any]] = []

    def keep(row: dict[str, Any]) -> None:
        rows.append(row)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")

    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            try:
                time_model(model, [case for case in base.CASES if case.model == model], args, Path(tmp), device, keep, platform)
            except Exception as error:  # noqa: BLE001 -- a model that does not export or load here: say why, go on
                print(f"{model}: FAILED {type(error).__name__}: {error}"[:500], flush=True)
    print(f"written: {out} ({len(rows)} rows, {device['gpu']}, onnxruntime {device['onnxruntime']})")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    measured = json.loads(args.measured.read_text())
    rows = base.compare_rows(measured["rows"], args.dir, args.target)
    columns = ("torch-eager", "torch-graph", "ort-cuda-device-io", "ort-cuda-graph")
    print(f"measured on {measured['gpu']} (onnxruntime {measured['onnxruntime']}, torch {measured['torch']}); estimate for {args.target}")
    print("| model | shape | precision | " + " | ".join(f"{c} ms" for c in columns) + " | estimate ms | estimate / best ORT | estimate / best PyTorch |")
    print("| --- | --- | --- | " + " | ".join("---:" for _ in columns) + " | ---: | ---: | ---: |")
    for row in rows:
        cells = " | ".join("-" if row["measured"].get(c) is None else f"{row['measured'][c]:.3f}" for c in columns)
        best_ort = min((v for k, v in row["measured"].items() if k.startswith("ort")), default=None)
        best_torch = min((v for k, v in row["measured"].items() if k.startswith("torch")), default=None)
        ratio = lambda best: "-" if best is None else f"{row['estimate_ms'] / best:.2f}x"  # noqa: E731
        print(f"| {row['model']} | {row['dims']} | {row['precision']} | {cells} | {row['estimate_ms']:.3f} | {ratio(best_ort)} | {ratio(best_torch)} |")
    if args.json_out:
        args.json_out.write_text(json.dumps({"target": args.target, "gpu": measured["gpu"], "rows": rows}, indent=1) + "\n")
    return 0


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="gpu_baseline_ort.py", description=__doc__.splitlines()[0])
    commands = main.add_subparsers(dest="command", required=True)
    timing = commands.add_parser("time", help="time every case with PyTorch and ONNX Runtime on the GPU; write JSON rows")
    timing.add_argument("--out", type=Path, help="JSON file (default: docs/benchmarks/gpu_ort_<gpu>.json)")
    timing.add_argument("--models", type=lambda text: base.parse_list(text, base.MODELS, "models"), default=base.MODELS)
    timing.add_argument("--iterations", type=int, default=200, help="timed calls per row (default: %(default)s)")
    timing.add_argument("--warmup", type=int, default=20, help="untimed calls first (default: %(default)s)")
    timing.add_argument("--cpu-dry-run", action="store_true", help="run the same code on the CPU to check the script (needs --out)")
    timing.add_argument("--energy-s", type=float, default=1.5, help="seconds of calls behind each energy figure; 0: none (default: %(default)s)")
    timing.set_defaults(func=cmd_time)
    base.add_compare_command(commands, cmd_compare, "folder written by `scripts/gpu_baseline.py export`")
    return main


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "iterations", 1) < 1 or getattr(args, "warmup", 1) < 1:
        raise SystemExit("gpu_baseline_ort: --iterations and --warmup must be at least 1")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
