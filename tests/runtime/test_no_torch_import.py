"""The runtime's dependency promise: edgekit_runtime imports and runs a bundle with torch, onnx, onnxscript,
optimum and transformers made unimportable.

The bundle is built here (with onnx); the child process blocks those packages with a meta-path finder,
imports every module under edgekit_runtime, then opens, self-checks and benchmarks the bundle.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.runtime.tiny_bundle import build_bundle

BLOCKED = ("torch", "onnx", "onnxscript", "optimum", "transformers")

CHILD = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys

    BLOCKED = set(sys.argv[2].split(","))

    class BlockHeavyPackages:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked: edgekit_runtime must not import it")
            return None

    sys.meta_path.insert(0, BlockHeavyPackages())
    already = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)

    import edgekit_runtime
    modules = [edgekit_runtime.__name__]
    for info in pkgutil.walk_packages(edgekit_runtime.__path__, prefix="edgekit_runtime."):
        importlib.import_module(info.name)
        modules.append(info.name)

    from edgekit_runtime.backends import create_runner
    from edgekit_runtime.bundle import open_bundle, self_check
    from edgekit_runtime.timing import benchmark_runner

    bundle = open_bundle(sys.argv[1])
    with create_runner(bundle) as runner:
        check = self_check(bundle, runner)
        inputs, _ = bundle.golden_batches[0].load()
        bench = benchmark_runner(runner, inputs, warmup=1, iterations=3)
    print(json.dumps({
        "already_imported": already,
        "modules": modules,
        "passed": check.passed,
        "bench_count": bench.stats.count,
        "blocked_loaded": sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED),
    }))
    """
)


def test_runtime_imports_and_runs_without_torch_or_onnx(tmp_path: Path) -> None:
    bundle_dir = build_bundle(tmp_path / "bundle")
    completed = subprocess.run(
        [sys.executable, "-c", CHILD, str(bundle_dir), ",".join(BLOCKED)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # not the repo root: import the installed package, not a checkout-relative path
    )
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    assert report["already_imported"] == []
    assert report["blocked_loaded"] == []
    for module in ("edgekit_runtime.bundle", "edgekit_runtime.signature", "edgekit_runtime.timing",
                   "edgekit_runtime.hashing", "edgekit_runtime.golden", "edgekit_runtime.backends.onnxruntime"):  # fmt: skip
        assert module in report["modules"]
    assert report["passed"] is True
    assert report["bench_count"] == 3
