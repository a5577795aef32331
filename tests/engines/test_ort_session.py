"""``cpu_session``: the one way host code opens a model in ONNX Runtime on the CPU (corpus, auto, estimate)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgekit.engines.ort_session import cpu_session



def _scale_model() -> onnx.ModelProto:
    """y = x * 1.0"""
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "one"], ["y"])], "scale",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [one])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("form", ["path", "str", "bytes", "proto"])
def test_opens_a_path_bytes_or_an_in_memory_model(tmp_path: Path, form: str) -> None:
    model = _scale_model()
    onnx.save(model, str(tmp_path / "m.onnx"))
    source = {"path": tmp_path / "m.onnx", "str": str(tmp_path / "m.onnx"), "bytes": model.SerializeToString(),
              "proto": model}[form]  # fmt: skip
    session = cpu_session(source, 1)
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x)
    assert session.get_providers() == ["CPUExecutionProvider"]


def test_options_are_the_callers(tmp_path: Path) -> None:
    import onnxruntime as ort

    options = cpu_session(_scale_model(), 2, graph_optimization="basic", allow_spinning=False).get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 1)
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert options.log_severity_level == 3
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    default = cpu_session(_scale_model(), log_severity_level=2).get_session_options()
    assert (default.intra_op_num_threads, default.log_severity_level) == (0, 2)  # 0: ONNX Runtime picks (every core)
    assert default.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with pytest.raises(KeyError):
        cpu_session(_scale_model(), graph_optimization="fast")


def test_denormals_are_flushed_unless_asked_not_to() -> None:
    # the session option, not the values: ONNX Runtime sets the flush-to-zero flags per thread (its pool's, and the
    # caller's only at times), so a run on the calling thread depends on what ran there before
    flushed = cpu_session(_scale_model(), 1).get_session_options()
    assert flushed.get_session_config_entry("session.set_denormal_as_zero") == "1"
    kept = cpu_session(_scale_model(), 1, denormal_as_zero=False).get_session_options()
    with pytest.raises(RuntimeError, match="does not have configuration with key"):
        kept.get_session_config_entry("session.set_denormal_as_zero")
