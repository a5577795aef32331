"""Variable-length published rows (issue 31): a BERT row whose harness runs each sample at its own length is
estimated at the length its figure reflects (median sample for a median latency, mean for a throughput), taken from
a cited length histogram, never at the 384-token padding and never by a fitted factor."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from scripts.published_lengths import LENGTHS, SQUAD_V1_1_LENGTHS, effective_length
from tests.estimate.test_published import TINY_ROW, _tiny_graphs, ep

HIDDEN = 8


def _sequence_graph(seq: int) -> onnx.ModelProto:
    """One [1, seq, 8] x [8, 8] MatMul: its work grows with the sequence length."""
    import numpy as np

    weight = numpy_helper.from_array(np.ones((HIDDEN, HIDDEN), np.float32), "w")
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")
    graph = helper.make_graph([node], "seq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, HIDDEN])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, HIDDEN])], [weight])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _sequence_graphs() -> dict:
    def build(path: Path, seq: int) -> str:
        onnx.save(_sequence_graph(seq), str(path))
        return f"a {seq}-token MatMul"

    return {"tiny-cnn": build}


SEQ_ROW = TINY_ROW.replace("    shape: {batch: 4}\n", "    shape: {batch: 4}\n    sequence_length: {lengths: squad-v1.1, statistic: median}\n")


def test_effective_length_is_the_median_sample_or_the_mean() -> None:
    assert effective_length([0, 2, 0, 1], "median") == 2  # lengths 2, 2, 4
    assert effective_length([0, 2, 0, 1], "mean") == 3  # 8 / 3 tokens, rounded
    assert effective_length([0, 0, 0, 5], "median") == 4 == effective_length([0, 0, 0, 5], "mean")
    with pytest.raises(ep.PublishedFiguresError, match="unknown sequence-length statistic 'p90'"):
        effective_length([1], "p90")
    with pytest.raises(ep.PublishedFiguresError, match="no samples"):
        effective_length([0, 0], "mean")


def test_the_squad_histogram_is_the_published_one() -> None:
    # Graphcore's SQuAD v1.1 histogram: 88,641 features (the training split at 384 tokens, stride 128), one bin per
    # length 1..384, 1,054 cut at 384; MLPerf's dev features are assumed alike (docs/estimates.md says so)
    assert len(SQUAD_V1_1_LENGTHS) == 384 and sum(SQUAD_V1_1_LENGTHS) == 88_641 and SQUAD_V1_1_LENGTHS[-1] == 1054
    assert LENGTHS["squad-v1.1"].url.startswith("https://github.com/graphcore/examples/blob/2d8b565")
    assert effective_length(SQUAD_V1_1_LENGTHS, "median") == 159
    assert effective_length(SQUAD_V1_1_LENGTHS, "mean") == 172


def test_every_variable_length_row_names_its_statistic() -> None:
    rows = ep.load_published(ep.FIGURES)
    bert = [r for r in rows if r.graph == "bert-large"]
    assert len(bert) >= 10
    for row in bert:  # NVIDIA's var-seqlen engines: no row is timed at the padded 384 tokens
        assert row.seq == (159 if row.metric == "latency_ms" else 172), row.id
        assert "tokens, the " + ("median" if row.metric == "latency_ms" else "mean") in row.seq_note, row.id
    assert all(r.seq is None for r in rows if r.graph != "bert-large")


def test_a_row_with_a_sequence_length_is_estimated_on_the_graph_at_that_length(tmp_path: Path) -> None:
    figures = tmp_path / "figures.yaml"
    figures.write_text(SEQ_ROW)
    sequence_graphs = _sequence_graphs()
    [row] = ep.load_published(figures, graphs=_tiny_graphs(), sequence_graphs=sequence_graphs)
    assert row.seq == 159 and "159 tokens, the median length of SQuAD v1.1" in row.seq_note
    [compared] = ep.compare_all([row], _tiny_graphs(), tmp_path / "graphs", sequence_graphs)
    assert (tmp_path / "graphs" / "tiny-cnn-seq159.onnx").is_file()
    assert compared.graph_note == "a 159-token MatMul"
    assert compared.gops == pytest.approx(2 * 159 * HIDDEN * HIDDEN / 1e9)  # the work of 159 tokens, not of 384
    assert "Estimated at 159 tokens, the median length" in ep.render_conditions([compared])


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t.replace("statistic: median", "statistic: p90"), "unknown sequence_length 'squad-v1.1' / 'p90'"),
    (lambda t: t.replace("lengths: squad-v1.1", "lengths: imdb"), "unknown sequence_length 'imdb'"),
    (lambda t: t.replace("{lengths: squad-v1.1, statistic: median}", "159"), "needs exactly 'lengths' and 'statistic'"),
])  # fmt: skip
def test_a_malformed_sequence_length_is_refused(tmp_path: Path, edit, message: str) -> None:
    figures = tmp_path / "figures.yaml"
    figures.write_text(edit(SEQ_ROW))
    with pytest.raises(ep.PublishedFiguresError) as caught:
        ep.load_published(figures, graphs=_tiny_graphs(), sequence_graphs=_sequence_graphs())
    assert message in str(caught.value) and "statistic: median | mean" in caught.value.hint


def test_a_graph_that_cannot_change_length_refuses_a_sequence_length(tmp_path: Path) -> None:
    figures = tmp_path / "figures.yaml"
    figures.write_text(SEQ_ROW)
    with pytest.raises(ep.PublishedFiguresError, match="graph 'tiny-cnn' cannot be built at another sequence length"):
        ep.load_published(figures, graphs=_tiny_graphs(), sequence_graphs={})
