#!/usr/bin/env python3
"""GPU baseline: the demo recipes in PyTorch CUDA eager, FP32 and FP16 -- what a TensorRT engine must beat.

Runs only on a machine with an NVIDIA GPU and a CUDA build of PyTorch (the CPU-only venv of this
repository has none; install the matching CUDA wheel of torch 2.13 there). Same cases as
scripts/bench_fp32_vs_pytorch.py: digits-cnn at batch 1 and 64, MiniLM at batch 1 and 8 (sequence 128).
Each case times FP32 and FP16 interleaved in rounds with CUDA events around every call (so the numbers
are GPU time plus launch overhead, not host queueing), after warm-up. FP16 is ``module.half()`` with
floating-point inputs cast to FP16; integer inputs (token ids) stay as they are. The FP16 output is
compared with FP32 (max abs diff, cosine) so a broken FP16 run cannot pass as fast.

    python scripts/gpu_baseline.py [--out docs/benchmarks/gpu_baseline_<gpu>.json] [--iterations 200]

Writes JSON with the GPU name, driver/CUDA/torch versions and the date, and prints a table. Exits 2
without a CUDA device: it never writes numbers it did not measure.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CASES = [
    ("digits-cnn", {"batch": 1}),
    ("digits-cnn", {"batch": 64}),
    ("minilm", {"batch": 1, "seq": 128}),
    ("minilm", {"batch": 8, "seq": 128}),
]


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def load_case(recipe_name: str, dims: dict[str, int], workdir: Path) -> tuple[Any, Any, dict[str, Any]]:
    """The recipe's PyTorch module on the GPU and one real sample batch at ``dims`` (as CUDA tensors)."""
    import torch

    from edgekit.data import fit_batch, load_batches
    from edgekit.recipe import load_recipe
    from edgekit.sources import load_source

    recipe = load_recipe(REPO / "recipes" / f"{recipe_name}.yaml")
    module = load_source(recipe, workdir).module
    if module is None:
        raise SystemExit(f"{recipe_name}: the source has no PyTorch module")
    batch = fit_batch(recipe.inputs, load_batches(recipe, recipe.data.samples, "samples")[0], dims)
    feeds = {spec.name: torch.from_numpy(batch[spec.name]).cuda() for spec in recipe.inputs}
    return module.eval().cuda(), recipe, feeds


def call(module: Any, recipe: Any, feeds: dict[str, Any]) -> Any:
    import torch

    with torch.inference_mode():
        out = module(*(feeds[spec.name] for spec in recipe.inputs))
    if isinstance(out, dict):
        out = out[recipe.outputs[0]]
    return out[0] if isinstance(out, (tuple, list)) else out


def time_case(variants: dict[str, tuple[Any, dict[str, Any]]], recipe: Any, warmup: int, iterations: int, rounds: int) -> dict[str, list[float]]:
    """Milliseconds per call for each variant, interleaved round by round."""
    import torch

    samples: dict[str, list[float]] = {name: [] for name in variants}
    for module, feeds in variants.values():
        for _ in range(warmup):
            call(module, recipe, feeds)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(rounds):
        for name, (module, feeds) in variants.items():
            for _ in range(max(1, iterations // rounds)):
                start.record()
                call(module, recipe, feeds)
                end.record()
                end.synchronize()
                samples[name].append(start.elapsed_time(end))
    return samples


def summary(samples: list[float], batch: int) -> dict[str, float]:
    p50 = statistics.median(samples)
    return {"p50_ms": round(p50, 4), "p90_ms": round(percentile(samples, 90), 4), "p99_ms": round(percentile(samples, 99), 4),
            "mean_ms": round(statistics.fmean(samples), 4), "min_ms": round(min(samples), 4),
            "throughput_per_s": round(batch * 1000 / p50, 1), "count": len(samples)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="default: docs/benchmarks/gpu_baseline_<gpu>.json")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(REPO))

    import numpy as np
    import torch

    if not torch.cuda.is_available():
        sys.stderr.write(f"gpu_baseline: no CUDA device visible to torch {torch.__version__} (a CPU build, or no GPU); nothing measured\n")
        return 2
    gpu = torch.cuda.get_device_name(0)
    major, minor = torch.cuda.get_device_capability(0)
    torch.backends.cudnn.benchmark = True
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-baseline-") as work:
        for recipe_name, dims in CASES:
            module, recipe, feeds = load_case(recipe_name, dims, Path(work))
            half = {k: (v.half() if v.is_floating_point() else v) for k, v in feeds.items()}
            module_fp16 = load_case(recipe_name, dims, Path(work))[0].half()
            reference = call(module, recipe, feeds).float().cpu().numpy()
            fp16_out = call(module_fp16, recipe, half).float().cpu().numpy()
            flat_ref, flat_16 = reference.reshape(reference.shape[0], -1), fp16_out.reshape(fp16_out.shape[0], -1)
            cosine = float(np.min(np.sum(flat_ref * flat_16, 1) / (np.linalg.norm(flat_ref, axis=1) * np.linalg.norm(flat_16, axis=1) + 1e-12)))
            samples = time_case({"fp32": (module, feeds), "fp16": (module_fp16, half)}, recipe, args.warmup, args.iterations, args.rounds)
            batch = dims["batch"]
            rows.append({
                "recipe": recipe_name, "dims": dims,
                "fp32": summary(samples["fp32"], batch), "fp16": summary(samples["fp16"], batch),
                "fp16_speedup_p50": round(statistics.median(samples["fp32"]) / statistics.median(samples["fp16"]), 3),
                "fp16_vs_fp32": {"max_abs_diff": float(np.abs(reference - fp16_out).max()), "cosine_min": cosine},
            })
            del module, module_fp16
            torch.cuda.empty_cache()
    result = {
        "benchmark": "PyTorch CUDA eager, fp32 and fp16 (the baseline TensorRT engines must beat)",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": {"name": gpu, "compute_capability": f"{major}.{minor}",
                "memory_gb": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)},
        "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
        "timing": {"method": "torch.cuda.Event around each call, synchronized", "warmup": args.warmup,
                   "iterations": args.iterations, "rounds": args.rounds, "cudnn_benchmark": True},
        "cases": rows,
    }
    out = args.out or REPO / "docs" / "benchmarks" / f"gpu_baseline_{re.sub(r'[^a-z0-9]+', '-', gpu.lower()).strip('-')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    header = f"{'recipe':<11} {'shape':<18} {'fp32 p50':>10} {'fp16 p50':>10} {'speedup':>8} {'fp16 cos':>9}"
    lines = [f"{gpu} (compute capability {major}.{minor}), torch {torch.__version__}", header, "-" * len(header)]
    for row in rows:
        shape = ",".join(f"{k}={v}" for k, v in row["dims"].items())
        lines.append(f"{row['recipe']:<11} {shape:<18} {row['fp32']['p50_ms']:8.3f}ms {row['fp16']['p50_ms']:8.3f}ms "
                     f"{row['fp16_speedup_p50']:7.2f}x {row['fp16_vs_fp32']['cosine_min']:9.5f}")
    sys.stdout.write("\n".join(lines) + f"\nwritten: {out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
