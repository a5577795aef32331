"""``--precision auto`` pays no fixed cost twice (issue 17: an auto build within 3x a plain int8 build): the
FP32 reference is not timed against itself once its latency is known, a graph variant's FP32 model is timed
beside its first candidate only, the interleaved timer stops on a candidate decisively over its bar, and the
engine build reuses the transformer fusion the search already did on the same file."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import onnx
import pytest

from edgekit.engines import fusion
from edgekit.precision import Precision
from edgekit.quantize.candidates import Candidate
from edgekit.quantize.ort.judges import OrtInterleavedTimer
from tests.quantize.test_auto import Scripted, other, static
from tests.quantize.test_auto_decisive import spiky_model, vectors


class Recording(Scripted):
    """Records which files each ``time_models`` call ran; a graph variant's FP32 model (``fused-fp32``) at 80 ms."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.calls: list[list[str]] = []
        self.fused = self.root / "fused-fp32.onnx"
        self.fused.write_bytes(b"fused-fp32")

    def time_models(self, paths: Sequence[Path]) -> list[float]:
        self.calls.append([Path(p).stem for p in paths])
        return [80.0 if p == self.fused else 100.0 if p == self.reference else self.latency_ms[p.read_bytes().decode()] for p in paths]


def test_the_fp32_reference_is_not_timed_against_itself_once_its_latency_is_known(tmp_path: Path) -> None:
    engine = Recording(tmp_path, {"static": 0.95, "fp32": 1.0}, {"static": 70})
    result = engine.search([static("static"), other("fp32", Precision.FP32)])
    rows = {row.name: row for row in result.table}
    assert result.chosen.name == "fp32" and rows["fp32"].latency_ratio == 1.0 and rows["fp32"].latency_ms == 100.0
    assert engine.calls == [["fp32-reference", "static"]]  # static only: FP32's ratio is 1 by definition
    assert result.stats["timed"] == 1 and result.stats["timing_skipped"] == 1


def test_the_fp32_reference_alone_is_timed_once_when_nothing_was_timed_before(tmp_path: Path) -> None:
    engine = Recording(tmp_path, {"fp32": 1.0}, {})
    result = engine.search([other("fp32", Precision.FP32)])
    assert result.chosen.name == "fp32" and result.chosen_result.latency_ratio == 1.0
    assert engine.calls == [["fp32-reference"]]


def test_a_graph_variants_fp32_model_is_timed_beside_its_first_candidate_only(tmp_path: Path) -> None:
    engine = Recording(tmp_path, {"fused-static": 0.95, "fused-dynamic": 0.995}, {"fused-static": 40, "fused-dynamic": 60})
    fused_static = Candidate("fused-static", Precision.INT8, static("x").plan, "fused", levels={"n0": 2})
    fused_dynamic = Candidate("fused-dynamic", Precision.INT8_DYNAMIC, static("x").plan, "fused", levels={"n0": 1})
    result = engine.search([fused_static, fused_dynamic], graph_references={"fused": engine.fused})
    assert engine.calls == [["fp32-reference", "fused-fp32", "fused-static"], ["fp32-reference", "fused-dynamic"]]
    rows = {row.name: row for row in result.table}
    assert rows["fused-static"].latency_ratio_same_graph_fp32 == pytest.approx(0.5)  # 40 / 80
    assert rows["fused-dynamic"].latency_ratio_same_graph_fp32 == pytest.approx(0.75)  # 60 / 80, from the first call's ratio
    assert result.chosen.name == "fused-dynamic"


def test_the_timer_stops_when_three_rounds_in_four_are_over_the_bar(tmp_path: Path) -> None:
    model = spiky_model(tmp_path / "fp32.onnx")
    same = shutil.copyfile(model, tmp_path / "same.onnx")
    timer = OrtInterleavedTimer({"x": vectors(1, 0)[0]["x"]}, threads=1, rounds=200, max_rounds=200, min_seconds=0.0, min_rounds=5)
    samples = [[1.0] * 10, [1.05] * 10]
    assert timer._decisively_over(samples, bar=1.0)  # 1.05x: under the 15 % margin, but every round over the bar
    assert not timer._decisively_over([s[:9] for s in samples], bar=1.0)  # not before twice min_rounds
    assert not timer._decisively_over([[1.0] * 10, [1.05] * 5 + [0.95] * 5], bar=1.0)  # half the rounds under: go on
    timer([model, same], bar=0.5)  # the same graph against a 0.5x bar: stopped long before 200 rounds
    assert timer.stopped_early == 1


def tiny_bert(path: Path) -> Path:
    """A one-layer BERT encoder (seeded weights), exported: a graph ONNX Runtime's attention fusion matches."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, max_position_embeddings=32)
    model = BertModel(config).eval()
    ids, mask = torch.ones(1, 8, dtype=torch.int64), torch.ones(1, 8, dtype=torch.int64)
    torch.onnx.export(model, (ids, mask), str(path), input_names=["input_ids", "attention_mask"], output_names=["hidden"], opset_version=17,
                      dynamo=False)
    return path


def test_the_engine_build_reuses_the_search_s_fusion_of_the_same_file(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    src = tiny_bert(tmp_path / "bert.onnx")
    first = fusion.transformer_fusion(src, tmp_path / "search-fused.onnx")
    assert first is not None and first["Attention"] == 1
    fused_runs: list[Path] = []
    real = fusion._fuse
    monkeypatch.setattr(fusion, "_fuse", lambda s, d: fused_runs.append(Path(d)) or real(s, d))
    again = fusion.transformer_fusion(src, tmp_path / "build-fused.onnx")
    assert again == first and fused_runs == []
    assert (tmp_path / "build-fused.onnx").read_bytes() == (tmp_path / "search-fused.onnx").read_bytes()
    (tmp_path / "search-fused.onnx").unlink()  # the earlier result is gone: fused again
    assert fusion.transformer_fusion(src, tmp_path / "third.onnx") == first and fused_runs == [tmp_path / "third.onnx"]
    onnx.save(onnx.load(str(src)), str(src))  # the source rewritten (new mtime): fused again
    fusion.transformer_fusion(src, tmp_path / "fourth.onnx")
    assert len(fused_runs) == 2
