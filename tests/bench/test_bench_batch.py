"""`edgekit bench` counts items per call as the build's benchmark does (review: bench took the first input's leading
size, the build its named batch dim: a fixed [8, 4096] input was 8 items a call to bench and 1 to the build, and a first
input `scale: [3]` before `x: [batch, 16]` made bench count 3 where the build counted 64)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edgekit.bench.compare import bench_batch, bench_bundle


def _manifest(*shapes: list[Any]) -> dict[str, Any]:
    return {"io": {"inputs": [{"name": f"in{index}", "dtype": "float32", "shape": shape} for index, shape in enumerate(shapes)]}}


@pytest.mark.parametrize(("shapes", "dims", "batch"), [
    (([3], ["batch", 16]), {"batch": 64}, 64),  # the first input has no batch axis: the named dim of the next one
    (([8, 4096],), {}, 1),  # a fixed axis 0 is one item per call, as the build counts it
    ((["n", 1, 8, 8],), {"n": 4}, 4),  # whatever the dim's name
    (([], ["batch", 16]), {"batch": 2}, 2),  # a scalar input first
    (([16, "seq"],), {"seq": 128}, 1),  # a named dim that is not at axis 0 is no batch
])  # fmt: skip
def test_bench_batch_follows_the_builds_rule(shapes: tuple[list[Any], ...], dims: dict[str, int], batch: int) -> None:
    assert bench_batch(_manifest(*shapes), dims) == batch


def test_bench_and_build_count_the_same_batch_for_a_fixed_axis(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    from edgekit.pipeline import build

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    (tmp_path / "fixed_data.py").write_text(
        "import numpy as np\n"
        "def batches():\n"
        "    return [{'x': np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)}]\n"
    )
    (tmp_path / "r.yaml").write_text(
        "schema_version: 1\nname: fixed-batch\nmodel: {kind: onnx, path: m.onnx}\n"
        "inputs:\n  - {name: x, dtype: float32, shape: [8, 16]}\noutputs: [y]\n"
        "data:\n  samples: {callable: 'fixed_data:batches'}\nbuild:\n  benchmark: {warmup: 1, iterations: 5}\n"
    )
    bundle_dir = build(tmp_path / "r.yaml", "x86-64-cpu", out=tmp_path / "bundle").bundle_dir
    import json

    built = json.loads((bundle_dir / "manifest.json").read_text())["benchmark"]["batch"]
    report = bench_bundle(bundle_dir, iterations=3, warmup=1, threads=1)
    assert built == report.batch == 1  # not 8: axis 0 is fixed, so the build times one item per call
    stats = report.variants["bundle"]
    assert stats["throughput_per_s"] == pytest.approx(1000.0 / stats["mean_ms"])
