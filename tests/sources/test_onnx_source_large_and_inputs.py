"""ONNX-file sources: a graph past protobuf's 2 GiB (simulated by lowering the threshold and making the checker
refuse in-memory graphs above it) keeps its weights in a .data file through load, opset conversion and the
fp32 copy; recipe inputs that differ from the graph's in
dtype or number are named as such before the graph first runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit import pipeline
from edgekit.errors import ExportError, SourceError
from edgekit.sources import onnx_file

MODULE = "tests.sources.test_onnx_source_large_and_inputs"
LIMIT = 1000  # bytes: the test's "2 GiB"


def batches(ids: str = "int64", gain: str = "gain") -> list[dict[str, np.ndarray]]:
    return [{"ids": np.arange(2, dtype=ids), gain: np.ones((2, 4), np.float32)}]


def _model(opset: int = 21) -> onnx.ModelProto:
    weights = numpy_helper.from_array(np.random.default_rng(0).standard_normal((500, 4)).astype(np.float32), "W")  # 8 kB
    graph = helper.make_graph(
        [helper.make_node("Gather", ["W", "ids"], ["rows"]), helper.make_node("Mul", ["rows", "gain"], ["emb"])], "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [-1]), helper.make_tensor_value_info("gain", TensorProto.FLOAT, [-1, 4])],
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, [-1, 4])], [weights])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _recipe(tmp_path: Path, inputs: str, kwargs: str = "{}") -> Path:
    model = _model()
    onnx.save(model, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    path = tmp_path / "recipe.yaml"
    lines = ["name: large", "model: {kind: onnx, path: m.onnx}", "inputs:", *(f"  {line}" for line in inputs.strip().splitlines()),
             "outputs: [emb]", "dims: {batch: {min: 1, opt: 2, max: 4}}", "data:", f'  samples: {{callable: "{MODULE}:batches", kwargs: {kwargs}}}']
    path.write_text("\n".join(lines) + "\n")
    return path


INPUTS = """\
- {name: ids, dtype: int64, shape: [batch], low: 0, high: 500}
- {name: gain, dtype: float32, shape: [batch, 4]}
"""


def _stages(recipe: Path, tmp_path: Path) -> pipeline.BuildState:
    state = pipeline.stage_load(recipe, "x86-64-cpu", "fp32", tmp_path / "out", True, None, True, True)
    state.workdir = tmp_path / "work"
    state.workdir.mkdir()
    pipeline.stage_source(state)
    pipeline.stage_export(state)
    return state


@pytest.fixture
def two_gib_at_1000_bytes(monkeypatch):
    """The checker refuses an in-memory graph past LIMIT bytes, as onnx does one past 2 GiB."""
    checker = onnx.checker.check_model

    def check(model, *args, **kwargs):
        if isinstance(model, onnx.ModelProto) and model.ByteSize() > LIMIT:
            raise ValueError("Message onnx.ModelProto exceeds maximum protobuf size of 2GB: 8300")
        return checker(model, *args, **kwargs)

    monkeypatch.setattr(onnx_file, "EXTERNAL_DATA_BYTES", LIMIT)
    monkeypatch.setattr(onnx.checker, "check_model", check)


def _external(path: Path) -> set[str]:
    model = onnx.load(str(path), load_external_data=False)
    return {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}


def test_an_onnx_source_past_the_size_limit_keeps_external_data_through_load_conversion_and_export(tmp_path, two_gib_at_1000_bytes):
    """Before: the in-memory check refused it ("copied completely" hint), and the fp32 copy was saved in one piece."""
    state = _stages(_recipe(tmp_path, INPUTS), tmp_path)
    assert state.loaded is not None and state.loaded.onnx_path == state.workdir / "source.onnx"  # dims renamed: a repaired copy
    assert _external(state.loaded.onnx_path) == {"source.onnx.data"}
    assert _external(state.fp32_path) == {"exported.onnx.data"}
    assert state.export["opset_conversion"]["converted_opset"] == 18
    assert max(o.version for o in onnx.load(str(state.fp32_path), load_external_data=False).opset_import) == 18
    assert state.signature_dict["outputs"][0]["shape"] == ["batch", 4]


def test_the_size_error_hint_says_to_save_with_external_data(tmp_path):
    hint = onnx_file._invalid_hint("Message onnx.ModelProto exceeds maximum protobuf size of 2GB: 2200000000", tmp_path / "m.onnx")
    assert "save_as_external_data=True" in hint and "copied completely" not in hint


def test_an_input_dtype_other_than_the_graphs_is_named(tmp_path):
    """Before: "does not run at the recipe's min dims ... check the recipe's dims" (ONNX Runtime's type error)."""
    recipe = _recipe(tmp_path, INPUTS.replace("ids, dtype: int64", "ids, dtype: int32"), "{ids: int32}")
    with pytest.raises(ExportError, match=r"inputs\.ids: dtype int32 in the recipe, but the ONNX graph takes int64") as info:
        _stages(recipe, tmp_path)
    assert info.value.hint == "set inputs.ids.dtype to int64"


def test_a_graph_input_the_recipe_does_not_list_is_named(tmp_path):
    recipe = _recipe(tmp_path, INPUTS.splitlines()[0])
    with pytest.raises(ExportError, match=r"the ONNX graph has inputs the recipe does not list: \['gain'\]") as info:
        _stages(recipe, tmp_path)
    assert info.value.hint.startswith("add gain under inputs")


def test_a_recipe_input_the_graph_lacks_gets_the_onnx_hint(tmp_path):
    recipe = _recipe(tmp_path, INPUTS.replace("name: gain", "name: scale"), "{gain: scale}")
    with pytest.raises((ExportError, SourceError), match=r"input 'scale' is not an input of the ONNX graph") as info:
        _stages(recipe, tmp_path)
    assert "forward()" not in info.value.hint


def test_a_dim_the_file_names_otherwise_takes_the_recipes_name_on_inputs_and_outputs(tmp_path):
    """Before: the bundle's output shape said ['N', 4], a dim the bundle does not declare (the recipe calls it batch)."""
    model = _model(opset=17)
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.shape.dim[0].Clear()
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    recipe = _recipe(tmp_path, INPUTS)
    onnx.save(model, str(tmp_path / "m.onnx"))
    state = _stages(recipe, tmp_path)
    assert state.signature_dict["outputs"][0]["shape"] == ["batch", 4]
    assert "dim 'N' of the file is the recipe's dim 'batch' (renamed on the graph's inputs and outputs)" in state.export["source_notes"]
