#!/usr/bin/env python3
"""Benchmark: FP32 bundles against PyTorch eager on the same inputs, side by side in one run.

MiniLM at batch 1 and 8 (sequence 128) and digits-cnn at batch 1 and 64. Each case times the bundle
(ONNX Runtime, CPU provider) and PyTorch eager interleaved in rounds with the same thread count, so
machine noise hits both alike. Writes JSON and prints a table. Target: bundle <= 0.8x eager latency.

    python scripts/bench_fp32_vs_pytorch.py [--out docs/benchmarks/fp32_vs_pytorch.json] [--iterations 60]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts.shared_setup import ensure_bundle  # noqa: E402
CASES = [
    ("digits-cnn", {"batch": 1}),
    ("digits-cnn", {"batch": 64}),
    ("minilm", {"batch": 1, "seq": 128}),
    ("minilm", {"batch": 8, "seq": 128}),
]
TARGET_RATIO = 0.8


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "fp32_vs_pytorch.json")
    parser.add_argument("--bundles", type=Path, default=REPO / "bundles" / "bench")
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--threads", type=int, default=min(os.cpu_count() or 1, 2))
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from edgekit.bench import bench_bundle
    from edgekit.bundle.manifest import host_description, toolchain_versions

    rows = []
    for recipe, dims in CASES:
        bundle = ensure_bundle(f"recipes/{recipe}.yaml", None, args.bundles, name=f"{recipe}-x86-64-cpu-fp32")
        report = bench_bundle(bundle, dims, iterations=args.iterations, warmup=5, vs_pytorch=True, threads=args.threads, rounds=6)
        ours, eager = report.variants["bundle"], report.variants["pytorch_eager"]
        rows.append({
            "recipe": recipe,
            "dims": dims,
            "bundle_p50_ms": ours["p50_ms"],
            "bundle_p99_ms": ours["p99_ms"],
            "eager_p50_ms": eager["p50_ms"],
            "eager_p99_ms": eager["p99_ms"],
            "ratio_p50": ours["p50_ms"] / eager["p50_ms"],
            "ratio_mean": ours["mean_ms"] / eager["mean_ms"],
            "meets_target": ours["p50_ms"] / eager["p50_ms"] <= TARGET_RATIO,
        })
    result = {
        "benchmark": "fp32 bundle vs PyTorch eager",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": host_description(),
        "toolchain": toolchain_versions(),
        "threads": args.threads,
        "iterations": args.iterations,
        "target_ratio": TARGET_RATIO,
        "cases": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    header = f"{'recipe':<11} {'shape':<20} {'bundle p50':>11} {'eager p50':>10} {'ratio':>6}  target <= {TARGET_RATIO}"
    lines = [header, "-" * len(header)]
    for row in rows:
        shape = ",".join(f"{k}={v}" for k, v in row["dims"].items())
        lines.append(f"{row['recipe']:<11} {shape:<20} {row['bundle_p50_ms']:9.2f}ms {row['eager_p50_ms']:8.2f}ms {row['ratio_p50']:6.2f}  {'yes' if row['meets_target'] else 'NO'}")
    sys.stdout.write("\n".join(lines) + f"\nwritten: {args.out}\n")
    return 0 if all(r["meets_target"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
