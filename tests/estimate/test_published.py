"""The published Jetson figures file is well-formed (every row has a source and its conditions) and
scripts/estimate_published.py renders its table from a real (small) ONNX graph, without the network."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

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
    assert len(rows) >= 6
    assert len({r.target for r in rows}) >= 2 and len({r.graph for r in rows}) >= 3
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

    section = ep.render_section([compared], "Why it is off: a test paragraph.", "now")
    above = "# How close are the estimates?\n\nthe host table\n\n## Using estimates\n\nusage\n\n"
    page = ep.replace_section(above + ep.HEADING + "\n\nNot done: this table has no rows.\n", section)
    assert page.startswith(above) and "Not done" not in page
    row_line = next(line for line in page.splitlines() if line.startswith("| Jetson Orin Nano"))
    assert "[example figures](https://example.org/figures)" in row_line and "| MAXN_SUPER |" in row_line
    assert f"{compared.error * 100:+.0f} %" in row_line and "| fp16 | 4 |" in row_line
    assert f"**{abs(compared.error) * 100:.0f} %**" in page and "a test paragraph" in page
    assert "**tiny**: a made-up figure for the rendering test; GPU; none" in page
    # no heading yet: the section is appended, the page kept
    assert ep.replace_section("# Title\n", section) == "# Title\n\n" + section
