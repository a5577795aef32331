"""The runner `edgekit bench` and `edgekit sweep` time a bundle with on this host: its intra-op threads spin only
briefly after each run, so sessions timed in turn in one process do not run while another's threads still spin."""

from __future__ import annotations

import onnxruntime
import pytest

from edgekit.bench.compare import host_runner
from edgekit.pipeline import build
from edgekit_runtime.agent.config_types import DEFAULT_SERVING_SPIN_US
from edgekit_runtime.backends.onnxruntime import spin_duration_supported
from edgekit_runtime.bundle import open_bundle
from edgekit_runtime.signature import IOSignature


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):  # type: ignore[no-untyped-def]
    from tests.conftest import TINY_RECIPE

    folder = tmp_path_factory.mktemp("host-runner")
    recipe = folder / "tiny.yaml"
    recipe.write_text(TINY_RECIPE.format(factory="tiny_net"))
    return open_bundle(build(recipe, "x86-64-cpu", out=folder / "bundle").bundle_dir)


def test_host_runner_spins_briefly_as_the_agent_serves(bundle) -> None:  # type: ignore[no-untyped-def]
    runner = host_runner(bundle, IOSignature.from_manifest(bundle.manifest["io"]), 2)
    try:
        options = runner.session.get_session_options()

        def entry(key: str) -> str | None:
            try:
                return str(options.get_session_config_entry(key))
            except RuntimeError:
                return None

        spinning, spin_us = entry("session.intra_op.allow_spinning"), entry("session.intra_op.spin_duration_us")
        if spin_duration_supported(onnxruntime.__version__):
            assert (spinning, spin_us) == ("1", str(DEFAULT_SERVING_SPIN_US))
        else:  # an older ONNX Runtime cannot bound the spin: its threads are parked instead
            assert (spinning, spin_us) == ("0", None)
    finally:
        runner.close()
