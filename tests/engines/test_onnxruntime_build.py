"""The ONNX Runtime bundle build: what the manifest says about the device (threads, opset), graph size
(initializers shared, not duplicated) and the fusion passes it skips."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.engines.fusion import NO_ATTENTION, attention_softmaxes
from edgekit.pipeline import build
from edgekit.target import get_target
from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner
from edgekit_runtime.bundle import open_bundle, self_check
from tests.sources.onnx_models import paddle_style_cnn, write_recipe


def test_device_threads_come_from_the_target_not_this_host(tiny_recipe, tmp_path: Path) -> None:
    manifest = build(tiny_recipe(), "raspberry-pi-5", out=tmp_path / "pi").manifest
    cores = get_target("raspberry-pi-5").cpu.cores
    assert cores == 4
    assert manifest["backend"]["intra_op_threads"] == 4
    assert manifest["benchmark"]["threads"] == min(os.cpu_count() or 1, cores)  # what this host ran with


def test_model_opset_is_the_bundled_graph_s(tiny_recipe, tmp_path: Path) -> None:
    import onnx

    manifest = build(tiny_recipe(), "x86-64-cpu", out=tmp_path / "b").manifest
    model = onnx.load(str(tmp_path / "b" / "model.onnx"))
    assert manifest["model"]["opset"] == max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


# ---------------------------------------------------------------------------------------------- size

BRANCH_RECIPE = """\
name: branches
model: {kind: onnx, path: branches.onnx}
inputs:
  - {name: x, dtype: float32, shape: [batch, 64]}
outputs: [y]
dims:
  batch: {min: 1, opt: 2, max: 4}
data:
  samples: {callable: "tests.engines.test_onnxruntime_build:branch_batches"}
build:
  benchmark: {warmup: 1, iterations: 3}
"""


def branch_batches() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    return [{"x": rng.normal(size=(2, 64)).astype(np.float32)} for _ in range(2)]


def _branch_model() -> onnx.ModelProto:
    """``y = x @ W.T`` if sum(x) > 0 else ``-x @ W.T``: each If branch transposes the same outer weight,
    which ONNX Runtime's constant folding turns into one folded copy per branch."""
    weight = np.random.default_rng(0).normal(size=(64, 64)).astype(np.float32)

    def branch(name: str, negate: bool) -> onnx.GraphProto:
        nodes = [helper.make_node("Transpose", ["W"], [f"{name}_wt"], perm=[1, 0])]
        source = "x"
        if negate:
            nodes.append(helper.make_node("Neg", ["x"], [f"{name}_nx"]))
            source = f"{name}_nx"
        nodes.append(helper.make_node("MatMul", [source, f"{name}_wt"], [f"{name}_y"]))
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, ["batch", 64])])

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
         helper.make_node("Greater", ["total", "zero"], ["positive"]),
         helper.make_node("If", ["positive"], ["y"], then_branch=branch("then", False), else_branch=branch("else", True))],
        "branches",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(np.array(0, dtype=np.float32), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    return model


def test_constants_folded_in_each_if_branch_are_stored_once(tmp_path: Path) -> None:
    onnx.save(_branch_model(), str(tmp_path / "branches.onnx"))
    (tmp_path / "branches.yaml").write_text(BRANCH_RECIPE)
    manifest = build(tmp_path / "branches.yaml", "x86-64-cpu", out=tmp_path / "bundle").manifest
    shared = manifest["backend"]["shared_constants"]
    assert shared["initializers_shared"] == 1 and shared["bytes_saved"] >= 64 * 64 * 4
    source = (tmp_path / "branches.onnx").stat().st_size
    assert manifest["model"]["size_bytes"] <= source * 1.05  # not 2x: one copy of the folded weight
    model = onnx.load(str(tmp_path / "bundle" / "model.onnx"))
    big = [t.name for t in model.graph.initializer if len(t.raw_data) >= 1024]
    assert len(big) == 1
    branches = [a.g for node in model.graph.node for a in node.attribute if a.HasField("g")]
    assert branches and all(len(t.raw_data) < 1024 for g in branches for t in g.initializer)
    bundle = open_bundle(tmp_path / "bundle")
    assert self_check(bundle, OnnxRuntimeRunner.from_bundle(bundle)).passed  # both branches still compute the same


SILERO = importlib.util.find_spec("silero_vad")
SILERO_DATA = Path(SILERO.submodule_search_locations[0]) / "data" if SILERO and SILERO.submodule_search_locations else None
VAD_RECIPE = """\
name: vad
model: {kind: onnx, path: vad.onnx}
inputs:
  - {name: input, dtype: float32, shape: [batch, 512]}
  - {name: state, dtype: float32, shape: [2, batch, 128]}
  - {name: sr, dtype: int64, shape: [], low: 16000, high: 16001}
outputs: [output, stateN]
dims:
  batch: {min: 1, opt: 2, max: 4}
data:
  samples: {npz_dir: samples}
build:
  benchmark: {warmup: 1, iterations: 3}
"""


@pytest.mark.skipif(SILERO_DATA is None, reason="silero-vad is not installed (pip install --no-deps silero-vad)")
def test_silero_vad_fp32_bundle_is_not_bigger_than_its_onnx_file(tmp_path: Path) -> None:
    assert SILERO_DATA is not None
    source = tmp_path / "vad.onnx"
    source.write_bytes((SILERO_DATA / "silero_vad_16k_op15.onnx").read_bytes())
    (tmp_path / "samples").mkdir()
    rng = np.random.default_rng(0)
    for index in range(2):
        np.savez(tmp_path / "samples" / f"{index}.npz", input=rng.uniform(-0.5, 0.5, (2, 512)).astype(np.float32),
                 state=np.zeros((2, 2, 128), np.float32), sr=np.array(16000, dtype=np.int64))
    (tmp_path / "vad.yaml").write_text(VAD_RECIPE)
    manifest = build(tmp_path / "vad.yaml", "x86-64-cpu", out=tmp_path / "bundle").manifest
    assert manifest["model"]["size_bytes"] <= source.stat().st_size  # was 1.81 MB for a 1.29 MB file
    assert manifest["backend"]["shared_constants"]["bytes_saved"] > 500_000  # the LSTM weights, once per If branch
    assert manifest["model"]["opset"] == 15


# ---------------------------------------------------------------------------------------------- fusion


def test_a_cnn_build_skips_the_transformer_fusions_and_says_so(tmp_path: Path) -> None:
    manifest = build(write_recipe(tmp_path, paddle_style_cnn(opset=13)), "x86-64-cpu", out=tmp_path / "bundle").manifest
    assert manifest["backend"]["transformer_fusion"] is None
    assert manifest["backend"]["transformer_fusion_skipped"] == NO_ATTENTION


def _attention_graph(head: str) -> onnx.ModelProto:
    """q, k, v projections of x[1, 8, 16]; ``head`` picks what follows the Softmax of the scores."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(16, 16)).astype(np.float32), n) for n in ("wq", "wk", "wv")]
    inits.append(numpy_helper.from_array(np.array(4.0, dtype=np.float32), "scale"))
    nodes = [helper.make_node("MatMul", ["x", w], [w + "_out"]) for w in ("wq", "wk", "wv")]
    nodes += [helper.make_node("Transpose", ["wk_out"], ["kt"], perm=[0, 2, 1]),
              helper.make_node("MatMul", ["wq_out", "kt"], ["scores"]),
              helper.make_node("Div", ["scores", "scale"], ["scaled"]),
              helper.make_node("Add", ["scaled", "mask"], ["masked"]),
              helper.make_node("Softmax", ["masked"], ["probs"], axis=-1)]
    nodes.append(helper.make_node("MatMul", ["probs", "wv_out"], ["y"]) if head == "values" else helper.make_node("Identity", ["probs"], ["y"]))
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16]),
                                                   helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_attention_pattern_is_recognised_and_a_classifier_softmax_is_not() -> None:
    assert attention_softmaxes(_attention_graph("values")) == 1
    assert attention_softmaxes(_attention_graph("probabilities")) == 0  # Softmax fed by MatMul, feeding no MatMul
    assert attention_softmaxes(paddle_style_cnn(opset=13)) == 0  # Gemm -> Softmax classifier head
