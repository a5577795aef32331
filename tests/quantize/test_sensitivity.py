"""Node groups and sensitivity analysis on tiny models built here, run with real ONNX Runtime sessions."""

from __future__ import annotations

import json
import platform
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.errors import QuantizationError
from edgekit.evaluate.metrics import METRICS
from edgekit.precision import Backend, Precision
from edgekit.quantize.ort.static_plan import calibration_tensors
from edgekit.quantize.ort.static_qdq import write_static_qdq
from edgekit.quantize.calibration import CalibratorSpec, calibrate
from edgekit.quantize.cpu_isa import X86_INT8_DOT_PRODUCT, read_host_isa
from edgekit.quantize.node_groups import find_node_groups, group_by_role, module_path
from edgekit.quantize.plan import QuantizationPlan
from edgekit.quantize.sensitivity import (
    QuantizationSimulator,
    SensitivityReport,
    analyze_sensitivity,
    fake_quantize_weight,
    sensitivity_svg,
)

OUTLIER = 3000.0


def static_plan(**changes: object) -> QuantizationPlan:
    plan = QuantizationPlan(Precision.INT8, Backend.ONNXRUNTIME, "uint8", False, "int8", True, "minmax",
                            float_outputs=("MatMul",), float_consumers_skip_qdq=True)
    return replace(plan, **changes)  # type: ignore[arg-type]


def _scopes(node: onnx.NodeProto, *scopes: str) -> onnx.NodeProto:
    entry = node.metadata_props.add()
    entry.key, entry.value = "pkg.torch.onnx.name_scopes", repr(["", *scopes, "linear"])
    return node


def outlier_model() -> onnx.ModelProto:
    """Three MatMuls, outputs concatenated. ``spiky`` (the input of ``fc_spiky``) has one channel scaled by 3000, so a
    per-tensor int8 range for it leaves the seven ordinary channels about one level each: that group is
    broken on purpose. The nodes carry dynamo-style scope metadata of a 'layer.0' / 'layer.1' model."""
    rng = np.random.default_rng(7)
    w_plain, w_spiky, w_small = (rng.normal(0, 1, (8, 8)).astype(np.float32) for _ in range(3))
    w_spiky[0, :] = 1e-5  # the outlier channel carries (almost) no signal
    scale = np.ones(8, dtype=np.float32)
    scale[0] = OUTLIER
    nodes = [
        _scopes(helper.make_node("MatMul", ["x", "w_plain"], ["a"], name="fc_plain"), "layer.0", "layer.0.intermediate", "layer.0.intermediate.dense"),
        helper.make_node("Mul", ["x", "scale"], ["spiky"], name="spike"),
        _scopes(helper.make_node("MatMul", ["spiky", "w_spiky"], ["b"], name="fc_spiky"), "layer.0", "layer.0.output", "layer.0.output.dense"),
        _scopes(helper.make_node("MatMul", ["x", "w_small"], ["c"], name="fc_small"), "layer.1", "layer.1.output", "layer.1.output.dense"),
        helper.make_node("Concat", ["a", "b", "c"], ["y"], name="concat", axis=1),
    ]
    inits = [numpy_helper.from_array(w, n) for w, n in ((w_plain, "w_plain"), (w_spiky, "w_spiky"), (w_small * 0.05, "w_small"), (scale, "scale"))]
    graph = helper.make_graph(nodes, "outlier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 24])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.fixture
def outlier_path(tmp_path: Path) -> Path:
    path = tmp_path / "outlier.onnx"
    onnx.save(outlier_model(), str(path))
    return path


def batches(count: int = 3, seed: int = 3) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (16, 8)).astype(np.float32), "labels": np.arange(16) % 8} for _ in range(count)]


@pytest.fixture
def ranges(outlier_path: Path) -> dict:
    tensors = calibration_tensors(outlier_path, static_plan())
    return calibrate(outlier_path, batches(4, seed=11), CalibratorSpec.create("minmax", symmetric=False), tensor_names=tensors).ranges


def test_groups_are_named_by_layer_and_role(outlier_path: Path) -> None:
    groups = find_node_groups(outlier_path)
    assert [(g.name, g.nodes, g.layer, g.role) for g in groups] == [
        ("layer.0/ffn.up", ("fc_plain",), 0, "ffn.up"),
        ("layer.0/ffn.down", ("fc_spiky",), 0, "ffn.down"),
        ("layer.1/ffn.down", ("fc_small",), 1, "ffn.down"),
    ]
    assert groups[0].weight_elements == 64
    by_role = group_by_role(groups)
    assert [(g.name, g.nodes) for g in by_role] == [("*/ffn.up", ("fc_plain",)), ("*/ffn.down", ("fc_spiky", "fc_small"))]


def test_names_from_torchscript_paths_weights_and_attention_roles() -> None:
    legacy = helper.make_node("MatMul", ["h", "w"], ["q"], name="/encoder/layer.3/attention/self/query/MatMul")
    assert module_path(legacy) == "encoder.layer.3.attention.self.query"
    by_weight = helper.make_node("Gemm", ["h", "classifier.weight", "classifier.bias"], ["z"], name="node_7")
    assert module_path(by_weight, {"classifier.weight": (2, 2)}) == "classifier"
    scores = helper.make_node("MatMul", ["q", "k"], ["s"], name="/encoder/layer.3/attention/self/MatMul_1")
    soft = helper.make_node("Softmax", ["s"], ["p"], name="/encoder/layer.3/attention/self/Softmax")
    context = helper.make_node("MatMul", ["p", "v"], ["ctx"], name="/encoder/layer.3/attention/self/MatMul_2")
    anonymous = helper.make_node("MatMul", ["ctx", "w2"], ["out"], name="mm")
    graph = helper.make_graph([legacy, scores, soft, context, anonymous], "g", [], [], [numpy_helper.from_array(np.ones((2, 2), np.float32), n) for n in ("w", "w2")])
    names = [g.name for g in find_node_groups(helper.make_model(graph))]
    assert names == ["layer.3/attn.q", "layer.3/attn.scores", "layer.3/attn.context", "mm"]


def test_the_outlier_group_ranks_first(outlier_path: Path, ranges: dict) -> None:
    report = analyze_sensitivity(outlier_path, static_plan(), ranges, batches(), METRICS["cosine"], metric_name="cosine", max_batches=2)
    assert [g.group for g in report.groups][0] == "layer.0/ffn.down"
    assert [g.rank for g in report.groups] == [1, 2, 3]
    worst, *others = report.groups
    assert worst.nodes == ("fc_spiky",)
    assert worst.loss > 10 * max(g.loss for g in others) > 0
    assert report.reference_value == pytest.approx(1.0)
    assert report.all_quantized_value <= worst.value + 1e-6
    assert report.batches == 2 and report.samples == 32 and report.mode == "only-this-group-quantized"


def test_role_grouping_runs_one_configuration_per_role(outlier_path: Path, ranges: dict) -> None:
    report = analyze_sensitivity(outlier_path, static_plan(), ranges, batches(), METRICS["cosine"], metric_name="cosine", group_by="role")
    assert [(g.group, g.nodes) for g in report.groups] == [("*/ffn.down", ("fc_spiky", "fc_small")), ("*/ffn.up", ("fc_plain",))]


#: ONNX Runtime's u8s8 kernels on an x86 CPU without VNNI/AMX add two products in int16 and saturate.
HOST_SATURATES = platform.machine() in ("x86_64", "AMD64") and not set(read_host_isa()) & set(X86_INT8_DOT_PRODUCT)


@pytest.mark.parametrize("reduce_range", [True, False], ids=["7-bit-weights", "8-bit-weights"])
def test_simulation_matches_the_written_static_model(outlier_path: Path, ranges: dict, tmp_path: Path, reduce_range: bool) -> None:
    """The float simulation equals ONNX Runtime's fused int8 kernels, except 8-bit weights on a CPU that saturates:
    there the spiky input (uint8 near 255) times full-range weights overflows int16, which is why such
    targets get 7-bit weights (edgekit.quantize.cpu_isa)."""
    plan = static_plan(reduce_range=reduce_range)
    simulator = QuantizationSimulator(outlier_path, plan, ranges, batches(2))
    simulated = simulator.outputs(simulator.all_nodes)
    written = write_static_qdq(outlier_path, tmp_path / "int8.onnx", plan, ranges)
    session = ort.InferenceSession(str(written), providers=["CPUExecutionProvider"])
    real = [session.run(None, {"x": b["x"]})[0] for b in batches(2)]
    worst = max(float(np.abs(sim - got).max() / np.abs(ref).max()) for sim, got, ref in zip(simulated, real, simulator.reference))
    if reduce_range or not HOST_SATURATES:
        assert worst < 1e-3
    else:
        assert worst > 1e-2, "expected int16 saturation on this CPU without VNNI"
    for sim, ref in zip(simulated, simulator.reference):
        assert np.abs(sim - ref).max() > 1e-3  # and the simulation does quantize


def test_excluded_nodes_are_not_groups(outlier_path: Path, ranges: dict) -> None:
    plan = static_plan(excluded={"fc_spiky": "recipe"})
    report = analyze_sensitivity(outlier_path, plan, ranges, batches(), METRICS["mse"], metric_name="mse", higher_is_better=False)
    assert sorted(g.group for g in report.groups) == ["layer.0/ffn.up", "layer.1/ffn.down"]
    assert all(g.loss >= 0 for g in report.groups)  # mse: lower is better, loss is the increase


def test_metric_ties_are_broken_by_output_error(outlier_path: Path, ranges: dict) -> None:
    def coarse(outputs: list, reference: list, labels: list) -> float:  # a metric no single group moves (like top-1 on few batches)
        return 1.0

    report = analyze_sensitivity(outlier_path, static_plan(), ranges, batches(), coarse, metric_name="coarse")
    assert all(g.loss == 0.0 for g in report.groups)
    assert [g.group for g in report.groups][0] == "layer.0/ffn.down"
    assert report.groups[0].output_error > report.groups[1].output_error >= report.groups[2].output_error


def test_report_round_trips_through_the_manifest(outlier_path: Path, ranges: dict) -> None:
    report = analyze_sensitivity(outlier_path, static_plan(), ranges, batches(), METRICS["cosine"], metric_name="cosine")
    data = json.loads(json.dumps(report.to_manifest()))
    assert data["groups"][0]["group"] == "layer.0/ffn.down" and data["groups"][0]["rank"] == 1
    assert set(data["groups"][0]) == {"group", "nodes", "value", "loss", "rank", "cosine_min", "output_error"}
    again = SensitivityReport.from_manifest(data)
    assert again.groups == report.groups
    assert again.most_sensitive(1)[0].nodes == ("fc_spiky",)
    assert again.by_group()["layer.1/ffn.down"].rank == report.by_group()["layer.1/ffn.down"].rank


def test_malformed_manifest_is_a_quantization_error() -> None:
    with pytest.raises(QuantizationError, match="sensitivity report in the manifest is malformed: KeyError"):
        SensitivityReport.from_manifest({"metric": "cosine"})


def test_plot_is_inline_svg_with_kept_groups_marked(outlier_path: Path, ranges: dict) -> None:
    report = analyze_sensitivity(outlier_path, static_plan(), ranges, batches(), METRICS["cosine"], metric_name="cosine")
    svg = sensitivity_svg(report, kept=["fc_spiky"])
    assert svg is not None and svg.startswith("<svg") and "layer.0/ffn.down" in svg
    assert "#c62828" in svg  # the kept group's bar is red
    assert sensitivity_svg(replace(report, groups=())) is None


def test_weight_fake_quantization_is_per_output_channel() -> None:
    weight = np.array([[1.0, 100.0], [-0.5, 50.0]], dtype=np.float32)
    per_channel = fake_quantize_weight(weight, axis=1)
    assert np.allclose(per_channel[:, 0], [1.0, -0.5], atol=1.0 / 254)  # column 0 keeps its own scale
    per_tensor = fake_quantize_weight(weight, axis=None)
    assert abs(per_tensor[1, 0] + 0.5) > abs(per_channel[1, 0] + 0.5)


def test_bad_inputs_raise_with_what_and_how(outlier_path: Path, ranges: dict) -> None:
    with pytest.raises(QuantizationError, match="max_batches >= 1, got 0"):
        analyze_sensitivity(outlier_path, static_plan(), ranges, batches(), METRICS["cosine"], max_batches=0)
    with pytest.raises(QuantizationError, match="weights int4") as info:
        analyze_sensitivity(outlier_path, static_plan(weight_type="int4"), ranges, batches(), METRICS["cosine"])
    assert "make_plan" in str(info.value)
    with pytest.raises(QuantizationError, match="no calibrated range for tensor 'spiky' \\(input of node 'fc_spiky', MatMul\\)"):
        analyze_sensitivity(outlier_path, static_plan(), {k: v for k, v in ranges.items() if k != "spiky"}, batches(), METRICS["cosine"])
    with pytest.raises(QuantizationError, match="(?s)no output 'logits'.*its outputs: y"):
        analyze_sensitivity(outlier_path, static_plan(), ranges, batches(), METRICS["cosine"], output="logits")
    with pytest.raises(QuantizationError, match="no evaluation batches"):
        analyze_sensitivity(outlier_path, static_plan(), ranges, [], METRICS["cosine"])
    with pytest.raises(QuantizationError, match="batch has no input x"):
        analyze_sensitivity(outlier_path, static_plan(), ranges, [{"image": np.zeros((1, 8), np.float32)}], METRICS["cosine"])
    with pytest.raises(QuantizationError, match="no MatMul/Gemm/Conv nodes to analyse"):
        analyze_sensitivity(outlier_path, static_plan(excluded={n: "x" for n in ("fc_plain", "fc_spiky", "fc_small")}), ranges, batches(), METRICS["cosine"])
    simulator = QuantizationSimulator(outlier_path, static_plan(), ranges, batches(1))
    with pytest.raises(QuantizationError, match="node 'spike' is not one of the simulated groups"):
        simulator.outputs(["spike"])
