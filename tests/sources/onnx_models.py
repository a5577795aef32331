"""Small ONNX files as other toolchains write them (opset 11/12, ``dim_value: -1``), built with onnx.helper,
and the recipes and data that build bundles from them."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RECIPE = """\
name: {name}
model:
  kind: onnx
  path: {file}
inputs:
  - {{name: x, dtype: float32, shape: [batch, 3, 8, 8]}}
outputs: [prob]
dims:
  batch: {{min: 1, opt: 2, max: 4}}
data:
  samples: {{callable: "tests.sources.onnx_models:image_batches"}}
  calibration: {{callable: "tests.sources.onnx_models:image_batches", kwargs: {{count: 4}}}}
  evaluation: {{callable: "tests.sources.onnx_models:image_batches"}}
evaluation:
  metric: cosine
  budget: {{min_value: {min_cosine}}}
build:
  benchmark: {{warmup: 1, iterations: 3}}
"""


def image_batches(count: int = 2, batch: int = 2) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    return [{"x": rng.uniform(-1, 1, size=(batch, 3, 8, 8)).astype(np.float32)} for _ in range(count)]


def _dims(value: onnx.ValueInfoProto, dims: list[int | str | None]) -> onnx.ValueInfoProto:
    """Rewrite a value's shape; an int <= 0 stays a dim_value (what Paddle2ONNX writes for a dynamic dim)."""
    shape = value.type.tensor_type.shape
    shape.Clear()
    for size in dims:
        dim = shape.dim.add()
        if isinstance(size, str):
            dim.dim_param = size
        elif size is not None:
            dim.dim_value = size
    return value


def paddle_style_cnn(opset: int = 11, seed: int = 0, batch_dim: int | str | None = -1) -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> Softmax, on
    ``x[batch_dim, 3, 8, 8]`` -> ``prob[batch_dim, 4]``, with weights drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    weights = {
        "conv.w": rng.normal(0, 0.5, (8, 3, 3, 3)), "conv.b": rng.normal(0, 0.1, 8),
        "bn.scale": rng.uniform(0.5, 1.5, 8), "bn.bias": rng.normal(0, 0.1, 8),
        "bn.mean": rng.normal(0, 0.1, 8), "bn.var": rng.uniform(0.5, 1.5, 8),
        "fc.w": rng.normal(0, 0.5, (4, 8)), "fc.b": rng.normal(0, 0.1, 4),
    }
    nodes = [
        helper.make_node("Conv", ["x", "conv.w", "conv.b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("BatchNormalization", ["c", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["n"], name="bn"),
        helper.make_node("Relu", ["n"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], axis=1, name="flatten"),
        helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["logits"], transB=1, name="fc"),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=1, name="softmax"),
    ]
    graph = helper.make_graph(
        nodes, "paddle_style_cnn",
        [_dims(helper.make_tensor_value_info("x", TensorProto.FLOAT, None), [batch_dim, 3, 8, 8])],
        [_dims(helper.make_tensor_value_info("prob", TensorProto.FLOAT, None), [batch_dim, 4])],
        [numpy_helper.from_array(array.astype(np.float32), name) for name, array in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="paddle2onnx-like")
    model.ir_version = 7
    return model


def unconvertible_model(opset: int = 11, seed: int = 0) -> onnx.ModelProto:
    """``prob = Softmax(If(true, Squeeze(Unsqueeze(Gemm(mean(x))), axes=[0])))``: onnx's version converter
    does not descend into the If branch, so upgraded to 13 the branch's Squeeze keeps its opset-11 ``axes``
    attribute and the converted graph is invalid."""
    base = paddle_style_cnn(opset, seed)
    graph = base.graph
    softmax = graph.node[-1]
    graph.node.remove(softmax)
    graph.node.append(helper.make_node("Unsqueeze", ["logits"], ["wide"], axes=[0], name="unsqueeze"))
    branch = helper.make_graph(
        [helper.make_node("Squeeze", ["wide"], ["narrow"], axes=[0], name="squeeze")], "branch", [],
        [helper.make_tensor_value_info("narrow", TensorProto.FLOAT, None)])
    graph.initializer.append(numpy_helper.from_array(np.array(True), "always"))
    graph.node.append(helper.make_node("If", ["always"], ["picked"], then_branch=branch,
                                       else_branch=helper.make_graph([helper.make_node("Squeeze", ["wide"], ["other"], axes=[0], name="squeeze2")],
                                                                     "other", [], [helper.make_tensor_value_info("other", TensorProto.FLOAT, None)]),
                                       name="if"))
    graph.node.append(helper.make_node("Softmax", ["picked"], ["prob"], axis=1, name="softmax"))
    return base


def write_recipe(directory: Path, model: onnx.ModelProto, name: str = "thirdparty", min_cosine: float = 0.5) -> Path:
    onnx.save(model, str(directory / f"{name}.onnx"))
    path = directory / f"{name}.yaml"
    path.write_text(textwrap.dedent(RECIPE.format(name=name, file=f"{name}.onnx", min_cosine=min_cosine)))
    return path
