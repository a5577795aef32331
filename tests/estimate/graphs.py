"""Small ONNX graphs built in the tests, with work that can be counted by hand."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def cnn(channels: int = 16) -> onnx.ModelProto:
    """x[batch,3,8,8] -> Conv 3x3 (pad 1, ``channels`` out) -> Relu -> Reshape -> MatMul (->10)."""
    weight = numpy_helper.from_array(np.full((channels, 3, 3, 3), 0.01, np.float32), "w")
    fc = numpy_helper.from_array(np.full((channels * 64, 10), 0.01, np.float32), "m")
    shape = numpy_helper.from_array(np.array([0, -1], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "m"], ["y"], name="fc")]  # fmt: skip
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])], [weight, fc, shape])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def mlp(hidden: int, layers: int = 2, width: int = 64) -> onnx.ModelProto:
    """x[batch,width] -> (MatMul width x hidden -> Add -> Relu) x layers ... : matmul- and elementwise-heavy."""
    nodes, inits, current, size = [], [], "x", width
    for i in range(layers):
        inits.append(numpy_helper.from_array(np.full((size, hidden), 0.01, np.float32), f"w{i}"))
        inits.append(numpy_helper.from_array(np.zeros(hidden, np.float32), f"b{i}"))
        nodes += [helper.make_node("MatMul", [current, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
                  helper.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"relu{i}")]  # fmt: skip
        current, size = f"r{i}", hidden
    nodes.append(helper.make_node("Softmax", [current], ["y"], name="softmax", axis=-1))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", hidden])], inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def qdq_matmul() -> onnx.ModelProto:
    """x -> Q -> DQ -> MatMul(DQ(int8 weight)): the Q-DQ pattern an engine runs in int8."""
    w = numpy_helper.from_array(np.ones((64, 32), np.int8), "w_q")
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "s")
    zero = numpy_helper.from_array(np.array(0, np.int8), "z")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq"),
             helper.make_node("DequantizeLinear", ["w_q", "s", "z"], ["wd"], name="dq_w"),
             helper.make_node("MatMul", ["xd", "wd"], ["y"], name="mm")]  # fmt: skip
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])], [w, scale, zero])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def conv_net(channels: int, size: int) -> onnx.ModelProto:
    """x[batch,3,size,size] -> Conv 3x3 (3->c) -> Relu -> Conv 3x3 (c->c) -> Relu -> GlobalAveragePool: conv-heavy."""
    w1 = numpy_helper.from_array(np.full((channels, 3, 3, 3), 0.01, np.float32), "w1")
    w2 = numpy_helper.from_array(np.full((channels, channels, 3, 3), 0.01, np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("GlobalAveragePool", ["r2"], ["y"], name="gap")]  # fmt: skip
    graph = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", channels, 1, 1])], [w1, w2])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
