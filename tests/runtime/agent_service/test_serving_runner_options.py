"""Runner options the agent sets for serving (``runner`` in its config): ONNX Runtime's intra-op spinning, how
long it spins, and pool size reach the session of the bundle it serves, per model, and only ONNX Runtime bundles
get them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from edgekit_runtime.agent.config import RunnerConfig, load_config
from edgekit_runtime.agent.config_types import DEFAULT_SERVING_SPIN_US, DEFAULT_SERVING_SPINNING
from edgekit_runtime.agent.errors import AgentConfigError
from edgekit_runtime.agent.loading import load_bundle
from edgekit_runtime.agent.repository import ModelRepository
from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner, spin_duration_supported
from edgekit_runtime.errors import BackendError
from edgekit_runtime.signature import IOSignature
from tests.runtime.tiny_bundle import io_section, reference_logits

SIGNATURE = IOSignature.from_manifest(io_section())
SPINNING_KEY = "session.intra_op.allow_spinning"
SPIN_US_KEY = "session.intra_op.spin_duration_us"
#: the installed ONNX Runtime bounds spinning in time (1.26 and later; check_py310 runs these tests on 1.23)
BOUNDS_SPINNING = spin_duration_supported(onnxruntime.__version__)


def config_entry(runner: OnnxRuntimeRunner, key: str) -> str | None:
    """A session config entry of the runner's loaded session; None where it was not set."""
    try:
        return str(runner.session.get_session_options().get_session_config_entry(key))
    except RuntimeError as err:
        assert "does not have configuration with key" in str(err)
        return None


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


@pytest.mark.parametrize("spin_us", [10, 250])
def test_intra_op_spin_us_bounds_the_spinning(model_path: Path, images: np.ndarray, spin_us: int) -> None:
    with OnnxRuntimeRunner(model_path, SIGNATURE, intra_op_spinning=True, intra_op_spin_us=spin_us, intra_op_threads=2) as runner:
        if BOUNDS_SPINNING:
            assert (config_entry(runner, SPINNING_KEY), config_entry(runner, SPIN_US_KEY)) == ("1", str(spin_us))
        else:  # an older ONNX Runtime would spin its own full length: the threads are parked instead
            assert (config_entry(runner, SPINNING_KEY), config_entry(runner, SPIN_US_KEY)) == ("0", None)
        np.testing.assert_allclose(runner.infer({"image": images})["logits"], reference_logits(images), rtol=1e-5, atol=1e-5)


def test_intra_op_spin_us_applies_where_spinning_is_left_to_onnx_runtime(model_path: Path) -> None:
    with OnnxRuntimeRunner(model_path, SIGNATURE, intra_op_spin_us=10) as runner:
        expected = (None, "10") if BOUNDS_SPINNING else ("0", None)  # None: ONNX Runtime's default, which spins
        assert (config_entry(runner, SPINNING_KEY), config_entry(runner, SPIN_US_KEY)) == expected


def test_intra_op_spin_us_does_nothing_when_spinning_is_off(model_path: Path) -> None:
    """A bundle that turns spinning off keeps it off under the agent's default spin length."""
    with OnnxRuntimeRunner(model_path, SIGNATURE, intra_op_spinning=False, intra_op_spin_us=10) as runner:
        assert (config_entry(runner, SPINNING_KEY), config_entry(runner, SPIN_US_KEY)) == ("0", None)


def test_an_onnx_runtime_without_the_spin_length_parks_the_threads(model_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    monkeypatch.setattr(onnxruntime, "__version__", "1.25.1")  # the last release whose library lacks the key
    with caplog.at_level(logging.INFO, logger="edgekit_runtime.backends.onnxruntime"):
        with OnnxRuntimeRunner(model_path, SIGNATURE, intra_op_spinning=True, intra_op_spin_us=10) as runner:
            assert (config_entry(runner, SPINNING_KEY), config_entry(runner, SPIN_US_KEY)) == ("0", None)
    assert "onnxruntime 1.25.1 cannot bound intra-op spinning to 10 us (1.26 and later can)" in caplog.text


@pytest.mark.parametrize(("version", "bounds"), [("1.25.1", False), ("1.26.0", True), ("1.32.0", True), ("1.26.0.dev20260101", True),
                                                 ("2.0.0", True), ("1.3.0", False), ("unknown", False)])  # fmt: skip
def test_which_onnx_runtime_bounds_spinning(version: str, bounds: bool) -> None:
    assert spin_duration_supported(version) is bounds


@pytest.mark.parametrize("value", [0, -5, 100_001, True, "10", 2.5])
def test_intra_op_spin_us_must_be_a_positive_int(model_path: Path, value: object) -> None:
    with pytest.raises(BackendError, match="intra_op_spin_us must be an int from 1 to 100000 or null"):
        OnnxRuntimeRunner(model_path, SIGNATURE, intra_op_spin_us=value)  # type: ignore[arg-type]


def test_config_defaults_to_a_brief_spin_and_overrides_per_model(agent_config: Callable[..., Path], tmp_path: Path) -> None:
    assert (DEFAULT_SERVING_SPINNING, DEFAULT_SERVING_SPIN_US) == (True, 10)
    plain = load_config(agent_config())
    assert plain.runner == RunnerConfig()
    assert plain.runner.backend_options(None) == {"onnxruntime": {"intra_op_spinning": True, "intra_op_spin_us": 10}}
    path = agent_config(models={"dir": str(tmp_path / "models"), "names": ["a", "b", "c", "d"]},
                        runner={"intra_op_threads": 1, "models": {"b": {"intra_op_spinning": False},
                                                                  "c": {"intra_op_spinning": None, "intra_op_spin_us": None, "intra_op_threads": None},
                                                                  "d": {"intra_op_spin_us": 200}}})  # fmt: skip
    runner = load_config(path).runner
    assert runner.backend_options("a") == {"onnxruntime": {"intra_op_spinning": True, "intra_op_spin_us": 10, "intra_op_threads": 1}}
    # spinning off: the spin length stays in the options and the runner ignores it (tested above)
    assert runner.backend_options("b") == {"onnxruntime": {"intra_op_spinning": False, "intra_op_spin_us": 10, "intra_op_threads": 1}}
    assert runner.backend_options("c") == {}  # null: the bundle's own settings
    assert runner.backend_options("d") == {"onnxruntime": {"intra_op_spinning": True, "intra_op_spin_us": 200, "intra_op_threads": 1}}


@pytest.mark.parametrize(("runner", "expected"), [
    ({"intra_op_spinning": "off"}, "runner.intra_op_spinning: expected true, false or null, got 'off'"),
    ({"intra_op_threads": 0}, "runner.intra_op_threads: expected an integer >= 1"),
    ({"intra_op_spin_us": 0}, "runner.intra_op_spin_us: expected an integer >= 1"),
    ({"intra_op_spinning": False, "intra_op_spin_us": 20}, "runner.intra_op_spin_us: bounds spinning, which intra_op_spinning: false turns off"),
    ({"models": {"other": {"intra_op_spin_us": 5}}}, "runner.models.other: names a model the agent does not serve"),
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
    config = load_config(agent_config(runner={"intra_op_spinning": True, "intra_op_spin_us": 40}))
    repository = ModelRepository(config, lambda event: None)
    assert repository.default.deployer._runner_options == {"onnxruntime": {"intra_op_spinning": True, "intra_op_spin_us": 40}}
