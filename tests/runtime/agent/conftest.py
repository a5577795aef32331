"""Fixtures for the agent's tests: real Mosquitto brokers (see mosquitto.py), and a real ONNX Runtime
session of the tiny test bundle behind an :class:`InferenceServer` (``server``) for the API's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edgekit_runtime.agent.serving import InferenceServer
from edgekit_runtime.backends import create_runner
from edgekit_runtime.bundle import open_bundle
from tests.runtime.agent.mosquitto import mosquitto, mosquitto_factory  # noqa: F401 (pytest fixtures)
from tests.runtime.tiny_bundle import build_bundle


@pytest.fixture
def server(tmp_path: Path) -> Iterator[InferenceServer]:
    """The tiny bundle (``image`` float32[batch, 1, 8, 8], batch 1..128 -> ``logits`` [batch, 10]), served."""
    bundle = open_bundle(build_bundle(tmp_path / "bundle"))
    server = InferenceServer(create_runner(bundle).load(), model_name=bundle.name)
    yield server
    server.close()
