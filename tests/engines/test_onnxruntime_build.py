"""The ONNX Runtime bundle build: what the manifest says about the device (threads, opset), graph size
(initializers shared, not duplicated) and the fusion passes it skips."""

from __future__ import annotations

import os
from pathlib import Path

from edgekit.pipeline import build
from edgekit.target import get_target


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
