"""What ``edgekit estimate`` prints: names from the graph are text, never rich markup, and sizes are decimal MB
(review: an input named "pixels[/]" crashed the command with a MarkupError; MiB were labelled MB)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgekit.cli.main import main
from edgekit.estimate.estimate import estimate
from edgekit.target import get_target


def test_names_with_markup_are_printed_as_they_are(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # one line a message, whatever the terminal
    graph = helper.make_graph([helper.make_node("Relu", ["pixels[/]"], ["y"])], "g",
                              [helper.make_tensor_value_info("pixels[/]", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])  # fmt: skip
    path = tmp_path / "[bold]markup.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert main(["estimate", str(path), "--target", "raspberry-pi-5"]) == 0
    out = capsys.readouterr().out
    assert "ESTIMATE for [bold]markup on raspberry-pi-5" in out
    assert "input 'pixels[/]' dim 0 ('N') not given: taken as 1" in out


def _weights(count: int) -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.zeros((count // 1000, 1000), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, count // 1000])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1000])], [weight])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_memory_is_in_decimal_megabytes(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    result = estimate(_weights(250_000), get_target("raspberry-pi-5"))  # 250,000 fp32 weights: exactly 1,000,000 bytes
    assert result.weights_mb == 1.0
    assert result.to_json()["memory_mb"]["weights"] == 1.0
    path = tmp_path / "w.onnx"
    onnx.save(_weights(250_000), str(path))
    assert main(["estimate", str(path), "--target", "raspberry-pi-5"]) == 0
    out = capsys.readouterr().out
    assert "(estimate: weights 1.0 + activations 0.0 + runtime 60)" in out
    assert "│ matmul │     1 │ 0.001 │     1.00 │" in out  # 1,000,000 weight bytes + 1,000 + 4,000 activation bytes: 1.00 MB moved
