"""Seconds per build stage, two ways side by side: the recipe as written, and the same recipe with the bench counts
every build used before ``edgekit.bench.counts`` (``build.benchmark: {warmup: 10, iterations: 50}``).

    python scripts/bench_build_stages.py RECIPE [--target x86-64-cpu] [--rounds 2] [--precision fp32] [--trust-code]

The two variants alternate within each round (order flipped every round); the script prints the host's CPU flags and
load average with the medians of each stage.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from edgekit.pipeline import build


def cpu_flags() -> str:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return " ".join(sorted(set(re.findall(r"\b(avx2|avx512f|avx512_vnni|amx_tile)\b", text))))


def with_fixed_counts(recipe: Path) -> Path:
    """A copy of ``recipe`` beside it (paths stay relative to its folder) with the old fixed bench counts."""
    data = yaml.safe_load(recipe.read_text())
    data.setdefault("build", {}).setdefault("benchmark", {}).update(warmup=10, iterations=50)
    copy = recipe.with_name(f".{recipe.stem}.fixed-counts.yaml")
    copy.write_text(yaml.safe_dump(data, sort_keys=False))
    return copy


def one_build(recipe: Path, args: argparse.Namespace, out: Path) -> dict[str, float]:
    started = time.perf_counter()
    manifest = build(recipe, args.target, precision=args.precision, out=out, force=True, trust_code=args.trust_code).manifest
    stages = {entry["name"]: float(entry["seconds"]) for entry in manifest["stages"]}
    stages["total (wall)"] = time.perf_counter() - started
    stages["timed calls"] = float(manifest["benchmark"]["warmup"] + manifest["benchmark"]["iterations"])
    return stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", type=Path)
    parser.add_argument("--target", default="x86-64-cpu")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trust-code", action="store_true")
    args = parser.parse_args()
    recipe = args.recipe.resolve()
    fixed = with_fixed_counts(recipe)
    runs: dict[str, list[dict[str, float]]] = {"as written": [], "fixed 10+50 calls": []}
    try:
        with tempfile.TemporaryDirectory(prefix="edgekit-stage-bench-") as tmp:
            for round_index in range(args.rounds):
                order = [("as written", recipe), ("fixed 10+50 calls", fixed)]
                for name, path in order if round_index % 2 == 0 else order[::-1]:
                    runs[name].append(one_build(path, args, Path(tmp) / "bundle"))
    finally:
        fixed.unlink()
    print(f"host: {os.cpu_count()} cores, flags {cpu_flags()}, load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    stages = list(runs["as written"][0])
    print(f"{'stage':<16}" + "".join(f"{name:>20}" for name in runs))
    for stage in stages:
        print(f"{stage:<16}" + "".join(f"{statistics.median(r[stage] for r in rows):>20.2f}" for rows in runs.values()))


if __name__ == "__main__":
    main()
