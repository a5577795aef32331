"""Runner options the agent sets for serving (``runner`` in its config): ONNX Runtime's intra-op spinning and
pool size reach the session of the bundle it serves, per model, and only ONNX Runtime bundles get them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edgekit_runtime.agent.config import RunnerConfig, load_config
from edgekit_runtime.agent.config_types import DEFAULT_SERVING_SPINNING
from edgekit_runtime.agent.errors import AgentConfigError
from edgekit_runtime.agent.loading import load_bundle
from edgekit_runtime.agent.repository import ModelRepository
from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner
from edgekit_runtime.errors import BackendError
from edgekit_runtime.signature import IOSignature
from tests.runtime.tiny_bundle import io_section, reference_logits

SIGNATURE = IOSignature.from_manifest(io_section())
SPINNING_KEY = "session.intra_op.allow_spinning"


@pytest.mark.parametrize(("spinning", "entry"), [(True, "1"), (False, "0")])
def test_intra_op_spinning_reaches_the_session(model_path: Path, images: np.ndarray, spinning: bool, entry: str) -> None:
    with OnnxRuntimeRunner(model_path, SIGNATURE, intra_op_spinning=spinning, intra_op_threads=2) as runner:
        assert runner.session.get_session_options().get_session_config_entry(SPINNING_KEY) == entry
        np.testing.assert_allclose(runner.infer({"image": images})["logits"], reference_logits(images), rtol=1e-5, atol=1e-5)


def test_intra_op_spinning_unset_leaves_onnx_runtime_its_default(model_path: Path) -> None:
    with OnnxRuntimeRunner(model_path, SIGNATURE) as runner:
        with pytest.raises(RuntimeError, match="does not have configuration with key"):
            runner.session.get_session_options().get_session_config_entry(SPINNING_KEY)


def test_intra_op_spinning_must_be_a_boolean(model_path: Path) -> None:
    with pytest.raises(BackendError, match="intra_op_spinning must be true, false or null, got 'no'"):
        OnnxRuntimeRunner(model_path, SIGNATURE, intra_op_spinning="no")  # type: ignore[arg-type]


def test_config_defaults_to_spinning_off_and_overrides_per_model(agent_config: Callable[..., Path], tmp_path: Path) -> None:
    assert DEFAULT_SERVING_SPINNING is False
    plain = load_config(agent_config())
    assert plain.runner == RunnerConfig()
    assert plain.runner.backend_options(None) == {"onnxruntime": {"intra_op_spinning": False}}
    path = agent_config(models={"dir": str(tmp_path / "models"), "names": ["a", "b", "c"]},
                        runner={"intra_op_threads": 1, "models": {"b": {"intra_op_spinning": True}, "c": {"intra_op_spinning": None,
                                                                                                         "intra_op_threads": None}}})  # fmt: skip
    runner = load_config(path).runner
    assert runner.backend_options("a") == {"onnxruntime": {"intra_op_spinning": False, "intra_op_threads": 1}}
    assert runner.backend_options("b") == {"onnxruntime": {"intra_op_spinning": True, "intra_op_threads": 1}}
    assert runner.backend_options("c") == {}  # null: the bundle's own settings


@pytest.mark.parametrize(("runner", "expected"), [
    ({"intra_op_spinning": "off"}, "runner.intra_op_spinning: expected true, false or null, got 'off'"),
    ({"intra_op_threads": 0}, "runner.intra_op_threads: expected an integer >= 1"),
    ({"spinning": False}, "runner.spinning: is not a known key"),
    ({"models": {"other": {"intra_op_spinning": True}}}, "runner.models.other: names a model the agent does not serve"),
])  # fmt: skip
def test_config_mistakes_name_the_key(agent_config: Callable[..., Path], runner: dict, expected: str) -> None:
    with pytest.raises(AgentConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load_config(agent_config(runner=runner))


def test_load_bundle_gives_each_backend_only_its_options(bundle_dir: Path, agent_config: Callable[..., Path]) -> None:
    bundles = load_config(agent_config(bundles={"dir": str(bundle_dir.parent / "store"), "allow_unsigned": True})).bundles
    loaded = load_bundle(bundle_dir, bundles, runner_options={"onnxruntime": {"intra_op_spinning": False},
                                                              "tensorrt": {"workspace_mb": 64}})  # fmt: skip
    try:
        assert isinstance(loaded.runner, OnnxRuntimeRunner) and loaded.runner.intra_op_spinning is False
        assert loaded.runner.session.get_session_options().get_session_config_entry(SPINNING_KEY) == "0"
    finally:
        loaded.runner.close()


def test_the_repository_serves_with_the_configs_runner_options(agent_config: Callable[..., Path], tmp_path: Path) -> None:
    config = load_config(agent_config(runner={"intra_op_spinning": True}))
    repository = ModelRepository(config, lambda event: None)
    assert repository.default.deployer._runner_options == {"onnxruntime": {"intra_op_spinning": True}}
