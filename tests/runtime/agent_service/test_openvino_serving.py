"""OpenVINO bundles of the digits demo, built by edgekit for x86-64-cpu (engine openvino, fp32 strict) and for the
Core Ultra NPU and iGPU (fp16, the CPU plugin standing in on the build host), installed signed into a real agent's model
repository and served over HTTP by the Open Inference Protocol: every golden batch sent as JSON comes back within the
bundle's own golden tolerances. This host has neither, so the agent runs those bundles on the CPU plugin because
``EDGEKIT_OPENVINO_STAND_IN=CPU`` says so, and its self-check names the stand-in."""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.bundle.signing import sign_bundle
from edgekit.pipeline import build
from edgekit_runtime.agent.cli import main as agent_main
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.service import AgentService
from edgekit_runtime.backends.openvino import STAND_IN_ENV
from edgekit_runtime.bundle import open_bundle, self_check
from edgekit_runtime.golden import compare_output
from tests.conftest import REPO

_HOST_PIPELINE = (
    "builds its bundles with edgekit's host pipeline (its report needs markupsafe, the digits demo torch); "
    "the runtime-only Python 3.10 check (scripts/check_py310.sh) installs none of that"
)
pytest.importorskip("markupsafe", reason=_HOST_PIPELINE)
pytest.importorskip("torch", reason=_HOST_PIPELINE)
ov = pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'edgekit[openvino]')")
DIGITS = REPO / "recipes" / "digits-cnn.yaml"
#: model name in the agent's repository -> (target, precision, backend option)
BUILDS = {"digits-x86": ("x86-64-cpu", "fp32", "openvino"), "digits-npu": ("intel-core-ultra-npu", "fp16", None),
          "digits-igpu": ("intel-core-ultra-igpu", "fp16", None)}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if {"NPU", "GPU"} & set(ov.Core().available_devices):
        pytest.skip("this machine has an Intel NPU or GPU: nothing stands in")
    root = tmp_path_factory.mktemp("openvino-bundles")
    return {name: build(DIGITS, target, precision=precision, out=root / name, backend=backend).bundle_dir
            for name, (target, precision, backend) in BUILDS.items()}  # fmt: skip


@pytest.fixture
def agent(built: dict[str, Path], agent_config: Callable[..., Path], tmp_path: Path, fleet_keys: tuple[Path, Path],
          monkeypatch: pytest.MonkeyPatch) -> Iterator[AgentService]:  # fmt: skip
    monkeypatch.setenv(STAND_IN_ENV, "CPU")
    path = agent_config(models={"names": list(BUILDS), "default": "digits-x86"})
    for name, source in built.items():
        bundle = shutil.copytree(source, tmp_path / "src" / name)  # inside the agent's allowed_sources
        sign_bundle(bundle, fleet_keys[0])
        assert agent_main(["install", str(bundle), "--config", str(path), "--model", name]) == 0
    with AgentService(load_config(path)) as service:
        yield service


def _post(agent: AgentService, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"http://{agent.api_address}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert reply.status == 200
        return json.loads(reply.read())


def _get(agent: AgentService, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{agent.api_address}{path}", timeout=30) as reply:
        return json.loads(reply.read())


def test_the_bundles_record_their_devices(built: dict[str, Path]) -> None:
    x86 = open_bundle(built["digits-x86"]).backend
    npu = open_bundle(built["digits-npu"]).backend
    assert x86["name"] == npu["name"] == "openvino"
    assert (x86["openvino"]["device"], x86["openvino"]["inference_precision_hint"]) == ("CPU", "f32")
    assert "host_stand_in" not in x86["openvino"]
    assert (npu["openvino"]["device"], npu["openvino"]["inference_precision_hint"], npu["openvino"]["shapes"]) == ("NPU", "f16", "per-shape")
    assert npu["openvino"]["host_stand_in"].startswith("CPU plugin on this host (no OpenVINO NPU here)")
    igpu = open_bundle(built["digits-igpu"]).backend["openvino"]
    assert (igpu["device"], igpu["inference_precision_hint"], igpu["shapes"]) == ("GPU", "f16", "dynamic")
    assert igpu["host_stand_in"].startswith("CPU plugin on this host (no OpenVINO GPU here)")


def test_the_agent_serves_both_over_http_oip_with_golden_outputs(agent: AgentService, built: dict[str, Path]) -> None:
    for name, source in built.items():
        metadata = _get(agent, f"/v2/models/{name}")
        assert metadata["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
        bundle = open_bundle(source)
        assert bundle.golden_batches, f"{name} has no golden batches"
        for batch in bundle.golden_batches:
            inputs, expected = batch.load()
            image = inputs["image"]
            reply = _post(agent, f"/v2/models/{name}/infer", {"inputs": [
                {"name": "image", "shape": list(image.shape), "datatype": "FP32", "data": image.ravel().tolist()}]})
            (output,) = reply["outputs"]
            assert (output["name"], output["shape"]) == ("logits", list(expected["logits"].shape))
            actual = np.asarray(output["data"], np.float32).reshape(output["shape"])
            check = compare_output("logits", expected["logits"], actual, **bundle.output_tolerances.for_output("logits").to_dict(),
                                   batch=batch.index)  # fmt: skip
            assert check.passed, f"{name} batch {batch.index}: {check}"
            assert (actual.argmax(axis=1) == expected["logits"].argmax(axis=1)).all()


def test_without_the_stand_in_the_npu_bundle_is_refused_naming_the_device(built: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from edgekit_runtime.backends import create_runner
    from edgekit_runtime.errors import BackendError

    monkeypatch.delenv(STAND_IN_ENV, raising=False)
    bundle = open_bundle(built["digits-npu"])
    with pytest.raises(BackendError, match="device NPU .*manifest.json backend.openvino.device.* not present") as err:
        create_runner(bundle).load()
    assert STAND_IN_ENV in (err.value.hint or "")
    monkeypatch.setenv(STAND_IN_ENV, "CPU")
    with create_runner(bundle) as runner:
        assert runner.providers == ("OpenVINO CPU standing in for NPU (f32)",)
        assert self_check(bundle, runner).passed
