"""The ONNX Runtime peers' files: one that ONNX Runtime cannot open is its row's error (the model's other rows are
measured), and ``--reuse`` reuses a peer file only when it is the whole file the earlier run finished."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from edgekit.corpus.base import CorpusModel
from edgekit.corpus.run import HOST_TARGET, CorpusRow, measure_host, ort_peers


def test_a_peer_file_onnx_runtime_cannot_open_is_its_rows_error_not_a_crash(small_model: CorpusModel, tmp_path: Path) -> None:
    broken = tmp_path / "ort_static.onnx"
    broken.write_bytes(b"\x08\x07 truncated")  # what a quantizer that died half-way leaves
    rows = [CorpusRow("cnn", "fp32", HOST_TARGET), CorpusRow("cnn", "ort-quantize_static", HOST_TARGET)]
    measure_host(small_model, rows, {"fp32": small_model.onnx_path, "ort-quantize_static": broken}, rounds=1, threads=1)
    fp32, peer = rows
    assert peer.error.startswith("ONNX Runtime failed: [ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model from "), peer.error
    assert str(broken) in peer.error and peer.p50_ms is None and peer.metric is None
    assert fp32.error is None and fp32.p50_ms > 0 and fp32.metric == pytest.approx(1.0) and fp32.x_fp32 == pytest.approx(1.0)


def test_a_peer_file_changed_since_its_build_is_built_again_on_reuse(small_model: CorpusModel, tmp_path: Path) -> None:
    peers = tmp_path / "peers"
    first = {r.variant: r for r in ort_peers(small_model, peers)}
    assert first["ort-quantize_static"].error is None
    static = peers / "ort_static.onnx"
    static.write_bytes(static.read_bytes()[:100])  # half-written by a run killed after the sidecar was written
    again = {r.variant: r for r in ort_peers(small_model, peers, reuse=True)}
    assert "reused" not in again["ort-quantize_static"].notes and again["ort-quantize_static"].error is None
    assert again["ort-quantize_dynamic"].notes == ["reused"]  # the one still whole is reused
    onnx.checker.check_model(onnx.load(str(static)))  # built again, whole
    assert again["ort-quantize_static"].size_bytes == static.stat().st_size


def test_a_run_killed_while_it_rewrites_a_peer_leaves_nothing_to_reuse(small_model: CorpusModel, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime.quantization

    peers = tmp_path / "peers"
    ort_peers(small_model, peers)
    whole = (peers / "ort_static.onnx").read_bytes()

    def killed(model_input: str, model_output: str, *args: object, **kwargs: object) -> None:
        Path(model_output).write_bytes(b"\x08\x07 half")
        raise KeyboardInterrupt  # the run is killed in the middle of the write

    monkeypatch.setattr(onnxruntime.quantization, "quantize_static", killed)
    with pytest.raises(KeyboardInterrupt):
        ort_peers(small_model, peers)  # a rebuild (without --reuse)
    monkeypatch.undo()
    assert not (peers / "ort_static.onnx.build.json").exists()  # the old sidecar went before the rebuild began
    assert (peers / "ort_static.onnx").read_bytes() == whole  # the half file never took the peer's name
    again = {r.variant: r for r in ort_peers(small_model, peers, reuse=True)}
    assert "reused" not in again["ort-quantize_static"].notes and again["ort-quantize_static"].error is None
