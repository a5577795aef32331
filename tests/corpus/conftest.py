"""Shared corpus fixtures: a small real CNN (the Paddle-style classifier of tests/sources) as a corpus model."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from edgekit.corpus.base import CorpusModel
from tests.sources.onnx_models import image_batches, paddle_style_cnn


@pytest.fixture()
def small_model(tmp_path: Path) -> CorpusModel:
    path = tmp_path / "cnn.onnx"
    onnx.save(paddle_style_cnn(opset=13, batch_dim="batch"), str(path))
    batches = image_batches(count=2, batch=4)
    return CorpusModel("cnn", "classification", path, batches, batches, batches[0], "prob", "tests.sources.onnx_models", min_value=0.9)
