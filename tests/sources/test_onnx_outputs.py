"""ONNX sources whose declared output shape is not what the graph produces (issue 29: a captcha OCR model declared
``[1, seqlen]`` and produced ``[T, 1, 8210]``): the build repairs the declaration from real runs and says so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.errors import SourceError
from edgekit.pipeline import build
from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner
from edgekit_runtime.bundle import open_bundle, self_check
from tests.sources.onnx_models import write_recipe


def _hidden_rank(source: str, out: str, inits: list[onnx.TensorProto]) -> list[onnx.NodeProto]:
    """``out = Reshape(source, shape(source)[NonZero(shape > 0)])``: the identity at run time, but shape inference
    cannot know the rank of the result (a gather of data-dependent length), as in graphs with loops or custom ops."""
    inits += [numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array([0], np.int64), "axis0")]
    return [helper.make_node("Shape", [source], ["s"], name="shape"), helper.make_node("Greater", ["s", "zero"], ["positive"], name="greater"),
            helper.make_node("NonZero", ["positive"], ["nonzero"], name="nonzero"),
            helper.make_node("Squeeze", ["nonzero", "axis0"], ["index"], name="squeeze"),
            helper.make_node("Gather", ["s", "index"], ["s2"], name="gather"), helper.make_node("Reshape", [source, "s2"], [out], name="reshape")]


def sequence_head(declared: list[int | str], hide_rank: bool = True) -> onnx.ModelProto:
    """``x[batch, 3, 8, 8]`` -> Conv -> Transpose to ``[8, batch, 4, 8]`` (time-major, as OCR heads write it) -> ``prob``,
    whose declared shape is ``declared``."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "conv.w")]
    nodes = [helper.make_node("Conv", ["x", "conv.w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Transpose", ["c"], ["t" if hide_rank else "prob"], perm=[2, 0, 1, 3], name="time_major")]
    if hide_rank:
        nodes += _hidden_rank("t", "prob", inits)
    graph = helper.make_graph(nodes, "sequence_head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, declared)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="mis-declared")
    model.ir_version = 8
    return model


def _self_check_passes(bundle_dir: Path) -> bool:
    bundle = open_bundle(bundle_dir)
    return self_check(bundle, OnnxRuntimeRunner.from_bundle(bundle)).passed


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_a_mis_declared_output_shape_is_rewritten_from_real_runs(tmp_path: Path, precision: str) -> None:
    recipe = write_recipe(tmp_path, sequence_head([1, "seqlen"]))
    manifest = build(recipe, "x86-64-cpu", precision=precision, out=tmp_path / "bundle").manifest
    assert manifest["io"]["outputs"] == [{"name": "prob", "dtype": "float32", "shape": [8, "batch", 4, 8]}]
    note = ("output 'prob': the file declares shape [1, seqlen] but the graph produces [8, 1, 4, 8] / [8, 2, 4, 8] / [8, 4, 4, 8] "
            "at the recipe's dims; declared shape rewritten to [8, batch, 4, 8]")
    assert note in manifest["export"]["source_notes"]
    assert [o.type.tensor_type.shape.dim[1].dim_param for o in onnx.load(str(tmp_path / "bundle" / "model.onnx")).graph.output] == ["batch"]
    assert _self_check_passes(tmp_path / "bundle")


def test_a_rank_that_shape_inference_sees_is_repaired_before_the_checker(tmp_path: Path) -> None:
    """Without the repair onnx.checker stopped the build with 'try export.exporter: legacy', a fix for a PyTorch export."""
    recipe = write_recipe(tmp_path, sequence_head([1, "seqlen"], hide_rank=False))
    manifest = build(recipe, "x86-64-cpu", precision="fp32", out=tmp_path / "bundle").manifest
    assert manifest["io"]["outputs"][0]["shape"] == [8, "batch", 4, 8]


def test_a_right_declaration_is_left_alone(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, sequence_head([8, "batch", 4, 8]))
    manifest = build(recipe, "x86-64-cpu", precision="fp32", out=tmp_path / "bundle").manifest
    assert manifest["export"]["source_notes"] == []
    assert manifest["io"]["outputs"][0]["shape"] == [8, "batch", 4, 8]


def test_an_output_whose_rank_follows_the_input_stops_the_build_naming_it(tmp_path: Path) -> None:
    """``prob = ConstantOfShape([2] * batch)``: rank 1 at batch 1, rank 2 at batch 2: no declaration fits."""
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array([0], np.int64), "axis0"),
             numpy_helper.from_array(np.array([2], np.int64), "two")]
    nodes = [helper.make_node("Shape", ["x"], ["xs"], name="x_shape"), helper.make_node("Gather", ["xs", "zero"], ["b"], name="batch_size"),
             helper.make_node("Unsqueeze", ["b", "axis0"], ["b1"], name="b1"), helper.make_node("Expand", ["two", "b1"], ["dims"], name="dims"),
             helper.make_node("ConstantOfShape", ["dims"], ["prob"], name="fill",
                              value=numpy_helper.from_array(np.array([1.0], np.float32)))]
    graph = helper.make_graph(nodes, "rank_follows_batch", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, "seqlen"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    with pytest.raises(SourceError, match=r"output 'prob' of the ONNX source changes rank with the input sizes \(\[2\], \[2, 2\], \[2, 2, 2, 2\]\)"):
        build(write_recipe(tmp_path, model), "x86-64-cpu", precision="fp32", out=tmp_path / "bundle")
