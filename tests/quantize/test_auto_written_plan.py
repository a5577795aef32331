"""``--precision auto`` records the plan as written: nodes ONNX Runtime's quantizer failed on, which the int8 writer
kept float, are in the result's plan (``excluded``) and in ``kept_in_higher_precision``, never claimed as int8."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgekit.precision import Backend, Precision
from edgekit.quantize.auto import search_auto
from edgekit.quantize.calibration import CalibratorSpec
from edgekit.quantize.candidates import Candidate
from edgekit.quantize.ort import static_qdq
from edgekit.quantize.ort.builder import OrtCandidateBuilder
from edgekit.quantize.plan import make_plan
from edgekit.recipe import QuantizationSpec
from edgekit.target import get_target


class _Passes:
    value = 1.0
    passed = True
    cosine_min = 1.0


def _two_matmuls(path: Path) -> Path:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"), helper.make_node("MatMul", ["h", "W2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])],
                              [numpy_helper.from_array(rng.normal(size=(32, 32)).astype(np.float32), name) for name in ("W1", "W2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_auto_result_plan_and_kept_name_the_node_the_quantizer_failed_on(tmp_path, monkeypatch):
    src = _two_matmuls(tmp_path / "fp32.onnx")
    real = static_qdq.write_static_qdq

    def fails_at_mm2(fp32_path, out_path, plan, ranges):  # as ONNX Runtime's quantizer does on some real graphs
        if "mm2" not in plan.excluded:
            raise static_qdq.QuantizerNodeError("simulated failure at mm2", "", node="mm2")
        return real(fp32_path, out_path, plan, ranges)

    monkeypatch.setattr(static_qdq, "write_static_qdq", fails_at_mm2)
    rng = np.random.default_rng(1)
    batches = [{"x": rng.normal(size=(8, 32)).astype(np.float32)} for _ in range(2)]
    builder = OrtCandidateBuilder(src, tmp_path / "work", batches, {"minmax": CalibratorSpec.create("minmax", symmetric=False)})
    plan = make_plan(QuantizationSpec(calibrator="minmax"), get_target("x86-64-cpu"), Backend.ONNXRUNTIME, Precision.INT8)
    assert "mm2" not in plan.excluded
    result = search_auto([Candidate("int8", Precision.INT8, plan), Candidate("fp32", Precision.FP32, None)], build=builder,
                         evaluate=lambda path: _Passes(), time_models=lambda paths, **_: [10.0] + [5.0] * (len(paths) - 1), reference=src)

    assert result.chosen.name == "int8"
    assert result.plan is not None and "mm2" in result.plan.excluded
    assert "ONNX Runtime's quantizer failed on it" in result.plan.excluded["mm2"]
    assert "mm1" not in result.plan.excluded
    manifest = result.to_manifest()
    assert "ONNX Runtime's quantizer failed on it" in manifest["plan"]["excluded"]["mm2"]
    assert "ONNX Runtime's quantizer failed on it" in manifest["kept_in_higher_precision"]["mm2"]
    assert "mm2" in result.kept
    # and the written graph agrees: mm2 reads its float weight
    written = onnx.load(str(result.model_path))
    mm2 = next(n for n in written.graph.node if n.name == "mm2")
    assert "W2" in mm2.input
