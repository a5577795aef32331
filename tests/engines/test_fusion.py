"""The graph edits around ONNX Runtime's transformer fusions (edgekit/engines/fusion.py), run in real ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.engines.fusion import _split_input_unsqueezes


def _unsqueeze_model(axes: list[int], shape: tuple[int, ...] | None = (2, 5)) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Unsqueeze", ["mask", "axes"], ["mask4"], name="unsqueeze")], "u",
                              [helper.make_tensor_value_info("mask", TensorProto.INT64, shape)],
                              [helper.make_tensor_value_info("mask4", TensorProto.INT64, None)],
                              [numpy_helper.from_array(np.array(axes, np.int64), "axes")])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _run(model: onnx.ModelProto, mask: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"mask": mask})[0]


@pytest.mark.parametrize("axes", [[1, 2], [-3, -2], [2, 1], [-1, 1], [0, -1, 2]])
def test_a_split_unsqueeze_gives_the_shape_of_the_original(axes: list[int]) -> None:
    """Unsqueeze counts negative axes from the end of its output: split into single-axis steps, they are made
    non-negative first (axis mod output rank), or each step would count from its own end."""
    model = _unsqueeze_model(axes)
    mask = np.arange(10, dtype=np.int64).reshape(2, 5)
    expected = _run(model, mask)
    assert _split_input_unsqueezes(model) == 1
    steps = [numpy_helper.to_array(t).tolist() for t in model.graph.initializer if t.name.startswith("unsqueeze.axis")]
    assert steps == [[axis] for axis in sorted(a % (2 + len(axes)) for a in axes)]
    got = _run(model, mask)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_negative_axes_of_an_input_of_unknown_rank_are_left_as_they_are() -> None:
    model = _unsqueeze_model([-3, -2], shape=None)
    assert _split_input_unsqueezes(model) == 0
    assert [node.op_type for node in model.graph.node] == ["Unsqueeze"]


def test_non_negative_axes_of_an_input_of_unknown_rank_keep_their_places() -> None:
    """The input's rank unknown: taking the output rank as len(axes) wrapped axes [1, 2] to [1, 0] and a (3, 5) mask
    came out (1, 1, 3, 5) instead of (3, 1, 1, 5)."""
    model = _unsqueeze_model([1, 2], shape=None)
    mask = np.arange(15, dtype=np.int64).reshape(3, 5)
    expected = _run(model, mask)
    assert _split_input_unsqueezes(model) == 1
    got = _run(model, mask)
    assert got.shape == expected.shape == (3, 1, 1, 5)
    np.testing.assert_array_equal(got, expected)
