"""Fixtures for the runtime tests: a tiny real bundle and model in tmp_path, and that bundle served (``server``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit_runtime.agent.serving import InferenceServer
from edgekit_runtime.backends import create_runner
from edgekit_runtime.bundle import open_bundle
from tests.runtime.tiny_bundle import build_bundle, write_linear_model


@pytest.fixture
def bundle_dir(tmp_path: Path) -> Path:
    return build_bundle(tmp_path / "bundle")


@pytest.fixture
def make_bundle(tmp_path: Path) -> Callable[..., Path]:
    counter = iter(range(1000))

    def make(**kwargs: Any) -> Path:
        return build_bundle(tmp_path / f"bundle_{next(counter)}", **kwargs)

    return make


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    return write_linear_model(tmp_path / "linear.onnx")


@pytest.fixture
def images() -> np.ndarray:
    return np.random.default_rng(3).standard_normal((4, 1, 8, 8)).astype(np.float32)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[InferenceServer]:
    """The tiny bundle (``image`` float32[batch, 1, 8, 8], batch 1..128 -> ``logits`` [batch, 10]), served."""
    bundle = open_bundle(build_bundle(tmp_path / "bundle"))
    server = InferenceServer(create_runner(bundle).load(), model_name=bundle.name)
    yield server
    server.close()
