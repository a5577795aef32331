"""A build's benchmark scales with what a call costs when the recipe sets no counts (issue 29: an fp32 build of a
3 MB classifier spent 64 s timing 60 calls on a loaded host), and times exactly what a recipe asks for."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.bench import counts
from edgekit.bench.counts import bench_counts
from edgekit.pipeline import build
from edgekit.recipe import BenchmarkSpec


def test_counts_by_hand() -> None:
    default = BenchmarkSpec()
    assert bench_counts(default, 5.0) == (10, 50, "defaults")  # 60 calls of 5 ms fit
    warmup, iterations, why = bench_counts(default, 1000.0)  # a second a call: 2 warm-up, 10 timed
    assert (warmup, iterations) == (2, 10) and why.startswith("time-bounded: a probe call took 1000 ms")
    assert bench_counts(default, 60_000.0)[:2] == (1, 10)  # never under 10 timed calls
    assert bench_counts(BenchmarkSpec(iterations=50), 1000.0) == (10, 50, "recipe build.benchmark")
    assert bench_counts(BenchmarkSpec(warmup=3), 1000.0) == (3, 50, "recipe build.benchmark")


def dense_stack() -> onnx.ModelProto:
    """``x[batch, 256]`` through four 256x256 MatMul + Relu layers: tens of ms a call at batch 4096."""
    rng = np.random.default_rng(2)
    nodes, inits, previous = [], [], "x"
    for layer in range(4):
        inits.append(numpy_helper.from_array(rng.normal(0, 0.06, (256, 256)).astype(np.float32), f"w{layer}"))
        nodes += [helper.make_node("MatMul", [previous, f"w{layer}"], [f"m{layer}"], name=f"fc{layer}"),
                  helper.make_node("Relu", [f"m{layer}"], [f"r{layer}" if layer < 3 else "y"], name=f"relu{layer}")]
        previous = f"r{layer}"
    graph = helper.make_graph(nodes, "dense_stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 256])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def dense_batches(count: int = 2) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    return [{"x": rng.normal(size=(8, 256)).astype(np.float32)} for _ in range(count)]


RECIPE = """\
name: dense
model: {{kind: onnx, path: dense.onnx}}
inputs:
  - {{name: x, dtype: float32, shape: [batch, 256]}}
outputs: [y]
dims:
  batch: {{min: 1, opt: 4096, max: 4096}}
data:
  samples: {{callable: "tests.bench.test_counts:dense_batches"}}
{benchmark}"""


def _recipe(directory: Path, benchmark: str = "") -> Path:
    onnx.save(dense_stack(), str(directory / "dense.onnx"))
    (directory / "dense.yaml").write_text(textwrap.dedent(RECIPE.format(benchmark=benchmark)))
    return directory / "dense.yaml"


def test_a_slow_call_is_timed_fewer_times_when_the_recipe_sets_no_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget is shrunk so that this model's call (tens of ms) counts as slow: 10 timed calls, not 50."""
    monkeypatch.setattr(counts, "BENCH_BUDGET_S", 0.05)
    monkeypatch.setattr(counts, "WARMUP_BUDGET_S", 0.01)
    benchmark = build(_recipe(tmp_path), "x86-64-cpu", precision="fp32", out=tmp_path / "bundle").manifest["benchmark"]
    assert (benchmark["warmup"], benchmark["iterations"]) == (1, 10)
    assert benchmark["counts"].startswith("time-bounded: a probe call took")


def test_counts_the_recipe_sets_are_timed_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(counts, "BENCH_BUDGET_S", 0.05)
    recipe = _recipe(tmp_path, "build:\n  benchmark: {warmup: 2, iterations: 12}\n")
    benchmark = build(recipe, "x86-64-cpu", precision="fp32", out=tmp_path / "bundle").manifest["benchmark"]
    assert (benchmark["warmup"], benchmark["iterations"], benchmark["counts"]) == (2, 12, "recipe build.benchmark")
