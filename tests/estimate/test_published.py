"""The published Jetson figures file is well-formed (every row has a source and its conditions) and
scripts/estimate_published.py renders its table from a real (small) ONNX graph, without the network."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.estimate.graphs import cnn

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("estimate_published", REPO / "scripts" / "estimate_published.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["estimate_published"] = module
    spec.loader.exec_module(module)
    return module


ep = _script()

TINY_ROW = """rows:
  - id: tiny
    module: Jetson Orin Nano 8GB developer kit (Super)
    target: jetson-orin-nano-super
    power_mode: MAXN_SUPER
    model: a 3x3 conv + fc test graph
    graph: tiny-cnn
    precision: fp16
    batch: 4
    shape: {batch: 4}
    metric: latency_ms
    value: 0.05
    measured: a made-up figure for the rendering test
    engine: GPU
    software: none
    source: {url: "https://example.org/figures", title: "example figures"}
"""


def _tiny_graphs() -> dict:
    def build(path: Path) -> str:
        onnx.save(cnn(), str(path))
        return "tests.estimate.graphs.cnn()"

    return {"tiny-cnn": build}


def test_every_published_row_has_a_source_and_its_conditions() -> None:
    rows = ep.load_published(ep.FIGURES)
    assert len(rows) >= 40  # issue 31: at least 40 rows over at least 4 sources and 3 Jetson modules
    assert len({r.group for r in rows}) >= 4 and len({r.target for r in rows}) >= 3 and len({r.graph for r in rows}) >= 3
    assert all(r.source_group for r in rows)  # every row says which source it is left out with
    for row in rows:
        assert row.source["url"].startswith("https://") and row.source["title"], row.id
        assert row.measured and row.engine and row.software and row.power_mode and row.precision, row.id
        assert row.metric in ep.METRICS and row.value > 0 and row.shape["batch"] == row.batch, row.id
        assert row.graph in ep.GRAPHS, row.id


@pytest.mark.parametrize(("edit", "message", "hint"), [
    (lambda t: t.replace('    source: {url: "https://example.org/figures", title: "example figures"}\n', ""),
     "rows[0] (tiny): missing 'source'", "add source:"),
    (lambda t: t.replace("power_mode: MAXN_SUPER", "power_mode: MAXN"), "has no power mode 'MAXN'", "MAXN_SUPER"),
    (lambda t: t.replace("metric: latency_ms", "metric: fps"), "metric 'fps' is not one of", "throughput_per_s"),
    (lambda t: t.replace("shape: {batch: 4}", "shape: {batch: 8}"), "shape batch 8 differs from batch 4", "published batch"),
    (lambda t: t.replace("https://example.org", "example.org"), "source needs an https url", "source: {url:"),
    (lambda t: t.replace("graph: tiny-cnn", "graph: yolov99"), "unknown graph 'yolov99'", "tiny-cnn"),
])  # fmt: skip
def test_a_malformed_row_is_refused_naming_the_row_field_and_fix(tmp_path: Path, edit, message: str, hint: str) -> None:
    path = tmp_path / "figures.yaml"
    path.write_text(edit(TINY_ROW))
    with pytest.raises(ep.PublishedFiguresError) as caught:
        ep.load_published(path, graphs=_tiny_graphs())
    text = str(caught.value)
    assert message in text and hint in text.split("hint:", 1)[1] and str(path) in text


def test_the_table_renders_one_row_from_a_real_graph_and_keeps_the_text_above(tmp_path: Path) -> None:
    figures = tmp_path / "figures.yaml"
    figures.write_text(TINY_ROW)
    graphs = _tiny_graphs()
    rows = ep.load_published(figures, graphs=graphs)
    [compared] = ep.compare_all(rows, graphs, tmp_path / "graphs")
    assert (tmp_path / "graphs" / "tiny-cnn.onnx").is_file()
    assert compared.estimate_value == pytest.approx(compared.p50_ms) and compared.p50_ms > 0
    assert compared.error == pytest.approx((compared.p50_ms - 0.05) / 0.05)
    assert compared.engine == "gpu" and compared.gops > 0 and compared.nodes >= 2
    assert compared.layers == 2 and compared.work is not None  # conv + relu, fc: TensorRT layers on a Jetson

    section = ep.render_section([compared], "Why it is off: a test paragraph.", "now")
    above = "# How close are the estimates?\n\nthe host table\n\n## Using estimates\n\nusage\n\n"
    page = ep.replace_section(above + ep.HEADING + "\n\nNot done: this table has no rows.\n", section)
    assert page.startswith(above) and "Not done" not in page
    row_line = next(line for line in page.splitlines() if line.startswith("| example.org | Jetson Orin Nano"))
    assert "[example figures](https://example.org/figures)" in row_line and "| MAXN_SUPER |" in row_line
    assert f"{compared.error * 100:+.0f} %" in row_line and "| fp16 | 4 |" in row_line and "| 4 -> 2 |" in row_line
    assert f"**{abs(compared.error) * 100:.0f} %**" in page and "a test paragraph" in page
    assert "fewer than two sources" in page  # one source: no leave-one-source-out validation
    assert "**tiny**: a made-up figure for the rendering test; GPU; none" in page
    # no heading yet: the section is appended, the page kept
    assert ep.replace_section("# Title\n", section) == "# Title\n\n" + section


def _work(group: str, value: float, compute_ms: float, layers: int = 10) -> "ep.RowWork":
    return ep.RowWork(f"{group}-{value}", group, "latency_ms", value, 1, np.full(layers, compute_ms / layers / 1e3),
                      np.zeros(layers), np.full(layers, 0.5), np.zeros(layers))  # fmt: skip


def test_default_parameters_reproduce_the_estimate(tmp_path: Path) -> None:
    from edgekit.estimate.roofline import TENSORRT_LAYER_LAUNCH_US, TENSORRT_MEMORY_SHARE
    from scripts.published_fit import Params

    figures = tmp_path / "figures.yaml"
    figures.write_text(TINY_ROW)
    graphs = _tiny_graphs()
    [compared] = ep.compare_all(ep.load_published(figures, graphs=graphs), graphs, tmp_path / "graphs")
    default = Params(1.0, 1.0, TENSORRT_MEMORY_SHARE, TENSORRT_LAYER_LAUNCH_US)
    assert ep.predicted(compared.work, default) == pytest.approx(compared.estimate_value)


def test_leave_one_source_out_never_scores_a_row_with_factors_fitted_to_it() -> None:
    from scripts.published_fit import leave_one_source_out

    # sources a and b agree (published = the roofline at the prior efficiency 0.5: compute scale 1), c disagrees wildly
    rows = [_work("a", 2.0, 1.0), _work("a", 4.0, 2.0), _work("b", 8.0, 4.0), _work("c", 0.5, 4.0)]
    folds, everything = leave_one_source_out(rows)
    assert set(folds) == {"a", "b", "c"}
    params_c, _ = folds["c"]  # fitted on a and b only: their scale, not c's
    assert params_c.compute_scale == pytest.approx(1.0, rel=0.15) and params_c.launch_us == 0.0
    assert folds["a"][0] != everything[0] or folds["b"][0] != everything[0]  # c moved the in-sample fit
    # changing c's published figure cannot change the factors c is scored with
    moved = [*rows[:3], _work("c", 50.0, 4.0)]
    assert leave_one_source_out(moved)[0]["c"][0] == params_c


def test_the_3d_unet_graph_is_valid_onnx_the_estimate_costs_with_its_3d_layers(tmp_path: Path) -> None:
    """MLPerf's KiTS19 3D-UNet as scripts/published_graphs.py writes it (narrow filters here, so the export is quick):
    the op counts of the published ONNX, a valid graph, and a TensorRT-shaped estimate that costs every Conv3D and
    ConvTranspose3D and runs each InstanceNorm as a layer of its own (its statistics span the whole volume)."""
    pytest.importorskip("torch", reason="the graph builders export with torch")
    from collections import Counter

    from edgekit.estimate.estimate import estimate
    from edgekit.target import get_target
    from scripts.published_graphs import _export, _unet3d_module

    import torch

    torch.manual_seed(0)
    path = _export(_unet3d_module(filters=(4, 8, 8, 8, 8)), {"image": torch.zeros(1, 1, 64, 64, 64)}, ["logits"], tmp_path / "unet.onnx",
                   {"image": {0: "batch", 2: "depth", 3: "height", 4: "width"}})  # fmt: skip
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    ops = Counter(n.op_type for n in model.graph.node)
    assert (ops["Conv"], ops["ConvTranspose"], ops["InstanceNormalization"], ops["Relu"], ops["Concat"]) == (23, 5, 22, 22, 5)
    result = estimate(model, get_target("jetson-agx-orin-64gb"), dims={"batch": 1, "depth": 128, "height": 128, "width": 128},
                      batch=1, power_mode="MAXN", calibration={"entries": []}, assume_precision="int8")  # fmt: skip
    convs = [n for n in result.cost.nodes if n.op_class == "conv"]
    assert len(convs) == 28 and all(n.ops > 0 for n in convs)
    first = next(n for n in convs if n.op_type == "Conv")  # 1 -> 4 channels, 3x3x3, over 128^3 voxels
    assert first.ops == pytest.approx(2 * 4 * 128**3 * 1 * 27)
    assert len(result.node_ms) == 28 + 22 and result.by_class["normalization"]["share"] > 0 and result.p50_ms > 0


def test_gpu_and_dla_offline_rows_get_the_dla_share_and_latency_rows_do_not() -> None:
    from edgekit.estimate.hardware import hardware_for
    from edgekit.target import get_target

    rows = {r.id: r for r in ep.load_published(ep.FIGURES)}
    offline, single = rows["mlperf-v3.0-nvidia-agx-orin-64gb-retinanet-offline"], rows["mlperf-v3.0-nvidia-agx-orin-64gb-retinanet-singlestream"]
    target = get_target(offline.target)
    hardware = hardware_for(target, offline.power_mode)
    assert offline.batch == 4 and "DLA" in offline.engine and ep.dla_share(offline, target, hardware) > 0
    assert ep.dla_share(single, target, hardware) == 0
