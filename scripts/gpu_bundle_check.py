#!/usr/bin/env python3
"""Bundles on this host's NVIDIA GPU as the agent loads them and as `edgekit bench --device cuda` times them.

For each bundle: the agent's load path (signature, file hashes, runner on the bundle's execution providers,
golden self-check on the GPU: ``edgekit_runtime.agent.loading.load_bundle``), then `edgekit bench` on the
CUDA provider (host I/O, device-resident I/O, CUDA graph, NVML energy) beside PyTorch eager on the same GPU
when the bundle's recipe is found. One JSON per bundle in --out, and a table at the end.

    python scripts/gpu_bundle_check.py BUNDLE... --out DIR [--iterations N]

Exit status 1 when a self-check or a bench failed (each failure is in its JSON), 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "runtime")]


def load_as_the_agent_does(bundle: Path) -> dict[str, Any]:
    from edgekit_runtime.agent.config import BundlesConfig
    from edgekit_runtime.agent.loading import load_bundle

    with tempfile.TemporaryDirectory() as tmp:
        loaded = load_bundle(bundle, BundlesConfig(dir=Path(tmp), allow_unsigned=True))
    try:
        binding = loaded.runner.device_binding
        return {"self_check_passed": loaded.check.passed, "providers": list(loaded.check.providers),
                "providers_that_failed": list(loaded.runner.providers_that_failed),
                "io_binding": binding.describe() if binding is not None else None,
                "outputs": [output.to_dict() for output in loaded.check.outputs]}  # fmt: skip
    finally:
        loaded.runner.close()


def bench_on_the_gpu(bundle: Path, iterations: int) -> dict[str, Any]:
    from edgekit.bench import bench_bundle

    manifest = json.loads((bundle / "manifest.json").read_text())
    recipe = REPO / "recipes" / Path(manifest["recipe"]["path"]).name  # built elsewhere: this checkout's copy
    note = None
    if recipe.is_file():
        try:
            return bench_bundle(bundle, iterations=iterations, warmup=20, vs_pytorch=True, recipe_path=recipe, device="cuda").to_json()
        except Exception as error:  # noqa: BLE001 -- e.g. the recipe's weights are not installed here: time the bundle alone
            note = f"no PyTorch column: {type(error).__name__}: {str(error)[:300]}"
    report = bench_bundle(bundle, iterations=iterations, warmup=20, device="cuda").to_json()
    return {**report, **({"vs_pytorch_note": note} if note else {})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_bundle_check.py", description=__doc__.splitlines()[0])
    parser.add_argument("bundles", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--iterations", type=int, default=200)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    failed = False
    lines = []
    for bundle in args.bundles:
        result: dict[str, Any] = {"bundle": str(bundle)}
        for step, run in (("agent_load", lambda: load_as_the_agent_does(bundle)), ("bench", lambda: bench_on_the_gpu(bundle, args.iterations))):
            try:
                result[step] = run()
            except Exception as error:  # noqa: BLE001 -- record it, go on with the next step and bundle
                failed = True
                result[step] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-3000:]}
        (args.out / f"{bundle.name}.json").write_text(json.dumps(result, indent=1) + "\n")
        load, bench = result["agent_load"], result["bench"]
        check = "error: " + load["error"][:120] if "error" in load else f"self-check {'passed' if load['self_check_passed'] else 'FAILED'} on {load['providers'][0]}"
        lines.append(f"{bundle.name}: {check}")
        if "error" in bench:
            lines.append(f"  bench error: {bench['error'][:200]}")
        else:
            for name, variant in bench["variants"].items():
                energy = variant.get("energy")
                joules = f"  {energy['mj_per_inference']:.4f} mJ/inf {energy['mean_w']:.0f} W" if energy else ""
                lines.append(f"  {name:<18} p50 {variant['p50_ms']:8.4f} ms{joules}")
        failed = failed or ("error" not in load and not load["self_check_passed"])
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
