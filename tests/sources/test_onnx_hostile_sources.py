"""ONNX files and recipe data from elsewhere that broke a build with a traceback or a misleading error, found by
reviewing the build with hostile inputs: each now builds (and self-checks) or is refused naming file, field and fix.
Real builds of tiny graphs with ONNX Runtime."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.errors import EdgekitError
from edgekit.pipeline import build
from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner
from edgekit_runtime.bundle import open_bundle, self_check

W = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)


def _model(outputs: list[onnx.ValueInfoProto] | None = None, *, x_shape: list | None = ["batch", 4],
           nodes: list[onnx.NodeProto] | None = None, opset: int = 17) -> onnx.ModelProto:  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)
    outputs = outputs if outputs is not None else [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])]
    graph = helper.make_graph(nodes or [helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], outputs,
                              [numpy_helper.from_array(W, "w")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="elsewhere")
    model.ir_version = 8
    return model


def _recipe(directory: Path, model: onnx.ModelProto, outputs: str = "[y]", data: str = "samples") -> Path:
    onnx.save(model, str(directory / "m.onnx"))
    samples = directory / "samples"
    samples.mkdir(exist_ok=True)
    for index in range(2):
        np.savez(samples / f"{index}.npz", x=np.random.default_rng(index).normal(size=(2, 4)).astype(np.float32))
    path = directory / "recipe.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: hostile
        model: {{kind: onnx, path: m.onnx}}
        inputs:
          - {{name: x, dtype: float32, shape: [batch, 4]}}
        outputs: {outputs}
        dims:
          batch: {{min: 1, opt: 2, max: 4}}
        data:
          samples: {{npz_dir: {data}}}
          calibration: {{npz_dir: {data}}}
        build:
          benchmark: {{warmup: 1, iterations: 2}}
        """))
    return path


def _built(recipe: Path, precision: str, out: Path) -> dict:
    manifest = build(recipe, "x86-64-cpu", precision=precision, out=out).manifest
    bundle = open_bundle(out)
    assert self_check(bundle, OnnxRuntimeRunner.from_bundle(bundle)).passed
    return manifest


def test_tensors_declared_without_a_shape_build(tmp_path: Path) -> None:
    # ONNX Runtime runs such files; the checker refused them with a hint about a damaged copy
    no_shape_y = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    manifest = _built(_recipe(tmp_path, _model(no_shape_y, x_shape=None)), "fp32", tmp_path / "b")
    notes = manifest["export"]["source_notes"]
    assert "input 'x' declared no shape: ['batch', 4] from the recipe" in notes
    assert any(note.startswith("output 'y' declared no shape") for note in notes), notes


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_outputs_listed_twice_or_held_as_constants_build_at_every_precision(tmp_path: Path, precision: str) -> None:
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3])
    manifest = _built(_recipe(tmp_path, _model([y, y, w]), outputs="[y, w]"), precision, tmp_path / "b")
    notes = manifest["export"]["source_notes"]
    assert "output 'y' was listed twice in the graph: once now" in notes
    assert "output 'w' is a constant of the graph: fed through an Identity node" in notes


def test_a_passed_through_input_is_refused_past_fp32(tmp_path: Path) -> None:
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    recipe = _recipe(tmp_path, _model([y, x]), outputs="[y, x]")
    _built(recipe, "fp32", tmp_path / "fp32")
    with pytest.raises(EdgekitError, match="output 'x' is input 'x' passed through unchanged; precision fp16") as caught:
        build(recipe, "x86-64-cpu", precision="fp16", out=tmp_path / "fp16")
    assert "build it at fp32" in caught.value.hint and not (tmp_path / "fp16").exists()


def test_int8_of_a_graph_with_nothing_to_quantize_says_so(tmp_path: Path) -> None:
    only_identity = _model(nodes=[helper.make_node("Identity", ["x"], ["y0"]), helper.make_node("Slice", ["y0", "s", "e", "a"], ["y"])])
    only_identity.graph.initializer.extend([numpy_helper.from_array(np.array([0], np.int64), n) for n in ("s", "a")]
                                           + [numpy_helper.from_array(np.array([3], np.int64), "e")])  # fmt: skip
    with pytest.raises(EdgekitError, match="precision int8 finds nothing to quantize") as caught:
        build(_recipe(tmp_path, only_identity), "x86-64-cpu", precision="int8", out=tmp_path / "b")
    assert "fp32 or fp16" in caught.value.hint  # was: "no tensors to calibrate", hint "pass tensor_names explicitly"


def test_external_weights_are_part_of_the_source_hash(tmp_path: Path) -> None:
    hashes = []
    for seed in (0, 1):
        folder = tmp_path / f"s{seed}"
        folder.mkdir()
        model = _model()
        model.graph.initializer[0].CopyFrom(numpy_helper.from_array(W * (seed + 1), "w"))
        onnx.save(model, str(folder / "m.onnx"), save_as_external_data=True, location="w.bin", size_threshold=0)
        recipe = _recipe(folder, onnx.load(str(folder / "m.onnx"), load_external_data=False))
        hashes.append(build(recipe, "x86-64-cpu", precision="fp32", out=folder / "b").manifest["model"]["source"]["sha256"])
    assert hashes[0] != hashes[1]  # the same graph file beside other weights is another source


@pytest.mark.parametrize(("write", "message"), [
    (lambda d: (d / "bad.npz").write_bytes(b"not a zip at all"), "bad.npz: cannot be read as an .npz of arrays"),
    (lambda d: np.savez(d / "obj.npz", x=np.array([{"a": 1}], dtype=object)), "obj.npz: cannot be read as an .npz of arrays"),
    (lambda d: os.symlink("/dev/zero", d / "zero.npz"), "zero.npz: not a regular file"),
    (lambda d: os.mkfifo(d / "fifo.npz"), "fifo.npz: not a regular file"),  # before: the build blocked for ever
    (lambda d: np.savez(d / "empty.npz", x=np.zeros((0, 4), np.float32)), "axis 0 (batch) is empty"),
])  # fmt: skip
def test_data_files_that_are_not_batches_are_refused_naming_the_file(tmp_path: Path, write, message: str) -> None:
    recipe = _recipe(tmp_path, _model())
    write(tmp_path / "samples")
    with pytest.raises(EdgekitError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build(recipe, "x86-64-cpu", precision="fp32", out=tmp_path / "b")


@pytest.mark.parametrize(("path", "message"), [
    ("m\\0.onnx", "the path contains a NUL character"),
    ("a" * 300 + ".onnx", "has a name 305 characters long"),
    ("~no-such-user-here/m.onnx", "a home folder this host does not know"),
])  # fmt: skip
def test_odd_paths_in_a_recipe_are_refused_naming_the_field(tmp_path: Path, path: str, message: str) -> None:
    recipe = _recipe(tmp_path, _model())
    recipe.write_text(recipe.read_text().replace("path: m.onnx", f'path: "{path}"'))
    with pytest.raises(EdgekitError, match=message) as caught:
        build(recipe, "x86-64-cpu", precision="fp32", out=tmp_path / "b")
    assert "model.path" in str(caught.value)


def test_a_recipe_naming_an_output_twice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(EdgekitError, match="outputs lists 'y' more than once"):
        build(_recipe(tmp_path, _model(), outputs="[y, y]"), "x86-64-cpu", precision="fp32", out=tmp_path / "b")


def test_string_tensors_leave_tensorrt_for_onnx_runtime_on_a_jetson(tmp_path: Path) -> None:
    # TensorRT networks have no string type: the bundle was built for it and could never load on the device
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "text-labels.yaml"
    manifest = build(recipe, "jetson-orin-nano-8gb", precision="fp16", out=tmp_path / "b").manifest
    assert manifest["backend"]["name"] == "onnxruntime"
    assert "tensorrt has no string tensors (input 'text')" in manifest["backend"]["selected_because"]
    with pytest.raises(EdgekitError, match="build.backend tensorrt has no string tensors, and input 'text' is one"):
        build(recipe, "jetson-orin-nano-8gb", precision="fp16", out=tmp_path / "trt", backend="tensorrt")
