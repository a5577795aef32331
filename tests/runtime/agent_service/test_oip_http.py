"""The Open Inference Protocol (KServe v2) on the agent's local API, driven by Triton's own HTTP client
(``tritonclient[http]``) and by ``curl``, for three models served at once; golden outputs from numpy."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.bundle.signing import sign_bundle
from edgekit_runtime import __version__ as AGENT_VERSION
from edgekit_runtime.agent.cli import main as agent_main
from edgekit_runtime.agent.client import AgentClient
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.service import AgentService
from tests.runtime.agent_service.model_bundles import embedder_inputs, make_model_bundle, reference_embedding, serving_models
from tests.runtime.tiny_bundle import reference_logits

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is in the dev extra (scripts/setup.sh)")
from tritonclient.utils import InferenceServerException  # noqa: E402

MODELS = ["digits", "embedder", "flat"]
VERSION = "1"  # each model slot serves version 1
BUNDLE_VERSION = "1735689600000"  # the bundles' created time in ms: their bundle_version, accepted as a version too
EXTENSIONS = ["binary_tensor_data", "classification", "model_configuration", "statistics", "model_repository"]
CURL = shutil.which("curl")


@pytest.fixture
def agent(agent_config: Callable[..., Path], tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Iterator[AgentService]:
    with serving_models(agent_config, tmp_path, fleet_keys[0], MODELS) as service:
        yield service


@pytest.fixture
def client(agent: AgentService) -> Iterator[Any]:
    triton = httpclient.InferenceServerClient(url=agent.api_address)
    yield triton
    triton.close()


def images(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 1, 8, 8)).astype(np.float32)


def tensor(name: str, array: np.ndarray, *, binary: bool) -> Any:
    datatype = {"float32": "FP32", "int64": "INT64"}[array.dtype.name]
    item = httpclient.InferInput(name, list(array.shape), datatype)
    item.set_data_from_numpy(array, binary_data=binary)
    return item


# -- tritonclient -----------------------------------------------------------------------------------------


def test_health_and_server_metadata(client: Any) -> None:
    assert client.is_server_live() and client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata == {"name": "edgekit-agent", "version": AGENT_VERSION, "extensions": EXTENSIONS}
    for name in MODELS:
        assert client.is_model_ready(name) and client.is_model_ready(name, model_version=VERSION)
        assert client.is_model_ready(name, model_version=BUNDLE_VERSION)
    assert not client.is_model_ready("digits", model_version="7")


def test_model_metadata_of_each_model(client: Any) -> None:
    digits = client.get_model_metadata("digits")
    assert digits == {"name": "digits", "versions": [VERSION], "platform": "edgekit_onnxruntime",
                      "inputs": [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 8, 8]}],
                      "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}],
                      "parameters": {"bundle_version": BUNDLE_VERSION}}  # fmt: skip
    embedder = client.get_model_metadata("embedder", model_version=VERSION)
    assert embedder["inputs"] == [{"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
                                  {"name": "attention_mask", "datatype": "INT64", "shape": [-1, -1]}]  # fmt: skip
    assert client.get_model_metadata("flat")["inputs"][0]["shape"] == [-1, 64]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_three_models_json_and_binary_match_golden(client: Any, binary: bool) -> None:
    x = images(3)
    outputs = [httpclient.InferRequestedOutput("logits", binary_data=binary)]
    digits = client.infer("digits", [tensor("image", x, binary=binary)], outputs=outputs, request_id="r-1")
    np.testing.assert_allclose(digits.as_numpy("logits"), reference_logits(x), rtol=1e-4, atol=1e-4)
    assert digits.get_response()["model_name"] == "digits" and digits.get_response()["id"] == "r-1"
    assert digits.get_response()["model_version"] == VERSION
    flat = client.infer("flat", [tensor("image", x.reshape(3, 64), binary=binary)], model_version=VERSION)
    np.testing.assert_allclose(flat.as_numpy("logits"), reference_logits(x), rtol=1e-4, atol=1e-4)
    feeds = embedder_inputs(4, seed=3)
    embedder = client.infer("embedder", [tensor(name, value, binary=binary) for name, value in feeds.items()],
                            outputs=[httpclient.InferRequestedOutput("sentence_embedding", binary_data=binary)])  # fmt: skip
    result = embedder.as_numpy("sentence_embedding")
    assert result.dtype == np.float32 and result.shape == (4, 8)
    np.testing.assert_allclose(result, reference_embedding(**feeds), rtol=1e-4, atol=1e-5)
    parameters = embedder.get_output("sentence_embedding").get("parameters", {})
    assert ("binary_data_size" in parameters) is binary


def test_oip_and_v1_answer_with_the_same_numbers_from_one_server(agent: AgentService, client: Any) -> None:
    x = images(2, seed=9)
    oip = client.infer("digits", [tensor("image", x, binary=True)]).as_numpy("logits")
    v1 = AgentClient(agent.api_address).infer({"image": x})["logits"]
    np.testing.assert_array_equal(oip, v1)
    totals = agent.models.get("digits").server.totals()
    assert totals.requests >= 2  # both went through the one serving core


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda c: c.infer("nope", [tensor("image", images(1), binary=False)]), "unknown model 'nope'; this agent serves: digits, embedder, flat"),
        (lambda c: c.infer("digits", [tensor("image", images(1), binary=False)], model_version="3"),
         "model 'digits' has no version '3'; it serves version 1 (bundle version 1735689600000)"),
        (lambda c: c.infer("digits", [tensor("pixels", images(1), binary=True)]), "model 'digits':"),
        (lambda c: c.infer("flat", [tensor("image", images(1), binary=True)]), "model 'flat':"),
        (lambda c: c.infer("digits", [tensor("image", images(1), binary=False)], outputs=[httpclient.InferRequestedOutput("probs")]),
         "outputs[0]: the model has no output 'probs'; its outputs: logits"),
        (lambda c: c.get_model_metadata("nope"), "unknown model 'nope'"),
    ],
    ids=["unknown_model", "unknown_version", "unknown_input", "wrong_shape", "unknown_output", "metadata_unknown"],
)
def test_errors_reach_tritonclient_with_the_reason(client: Any, call: Callable[[Any], Any], fragment: str) -> None:
    with pytest.raises(InferenceServerException) as info:
        call(client)
    assert fragment in info.value.message()


# -- curl -------------------------------------------------------------------------------------------------


def curl(agent: AgentService, path: str, *args: str, data: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    if CURL is None:
        pytest.skip("curl is not installed (apt-get install curl)")
    command = [CURL, "-sS", "-D", "-", "--max-time", "20", *args, f"http://{agent.api_address}{path}"]
    if data is not None:
        command[1:1] = ["--data-binary", "@-"]
        if not any(arg.lower().startswith("content-type:") for arg in args):  # curl's default is a form, refused (415)
            command[1:1] = ["-H", "Content-Type: application/json"]
    done = subprocess.run(command, input=data, capture_output=True, check=True, timeout=30)
    head, _, body = done.stdout.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {line.split(":", 1)[0].lower(): line.split(":", 1)[1].strip() for line in lines[1:] if ":" in line}
    return int(lines[0].split()[1]), headers, body


def test_curl_json_inference_matches_golden(agent: AgentService) -> None:
    x = images(2, seed=4)
    request = {"id": "c-1", "inputs": [{"name": "image", "shape": [2, 1, 8, 8], "datatype": "FP32", "data": x.reshape(-1).tolist()}]}
    status, headers, body = curl(agent, "/v2/models/digits/infer", "-H", "Content-Type: application/json", data=json.dumps(request).encode())
    assert status == 200 and headers["content-type"].startswith("application/json")
    reply = json.loads(body)
    assert reply["model_name"] == "digits" and reply["id"] == "c-1" and reply["model_version"] == VERSION
    (output,) = reply["outputs"]
    assert output["name"] == "logits" and output["datatype"] == "FP32" and output["shape"] == [2, 10]
    np.testing.assert_allclose(np.array(output["data"], np.float32).reshape(2, 10), reference_logits(x), rtol=1e-4, atol=1e-4)
    # nested data (the other form the protocol allows) and int64 inputs
    feeds = embedder_inputs(2, seed=5)
    nested = {"inputs": [{"name": name, "shape": list(value.shape), "datatype": "INT64", "data": value.tolist()} for name, value in feeds.items()]}
    status, _, body = curl(agent, "/v2/models/embedder/infer", data=json.dumps(nested).encode())
    assert status == 200
    values = json.loads(body)["outputs"][0]["data"]
    np.testing.assert_allclose(np.array(values, np.float32).reshape(2, 8), reference_embedding(**feeds), rtol=1e-4, atol=1e-5)


def test_curl_binary_inference_matches_golden(agent: AgentService) -> None:
    x = images(3, seed=6).reshape(3, 64)
    header = json.dumps({"inputs": [{"name": "image", "shape": [3, 64], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()  # fmt: skip
    status, headers, body = curl(agent, "/v2/models/flat/versions/" + VERSION + "/infer", "-H", "Content-Type: application/octet-stream",
                                 "-H", f"Inference-Header-Content-Length: {len(header)}", data=header + x.astype("<f4").tobytes())  # fmt: skip
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    length = int(headers["inference-header-content-length"])
    reply = json.loads(body[:length])
    (output,) = reply["outputs"]
    assert output["parameters"] == {"binary_data_size": 3 * 10 * 4} and "data" not in output
    logits = np.frombuffer(body[length:], "<f4").reshape(3, 10)
    np.testing.assert_allclose(logits, reference_logits(x.reshape(3, 1, 8, 8)), rtol=1e-4, atol=1e-4)


def test_curl_health_metadata_and_error_objects(agent: AgentService) -> None:
    assert curl(agent, "/v2/health/live")[0] == 200
    status, _, body = curl(agent, "/v2/health/ready")
    assert status == 200 and json.loads(body) == {"ready": True}
    status, _, body = curl(agent, "/v2/models/embedder/ready")
    assert status == 200 and json.loads(body) == {"name": "embedder", "ready": True}
    cases = [
        ("/v2/models/nope", [], None, 404, "unknown model 'nope'"),
        ("/v2/models/digits/explain", [], None, 404, "no endpoint /v2/models/digits/explain"),
        ("/v2/models/digits/infer", [], None, 405, "GET is not allowed on /v2/models/digits/infer; use POST"),
        ("/v2/models/digits/infer", [], b"{not json", 400, "the inference request's JSON header is not valid JSON"),
        ("/v2/models/digits/infer", [], json.dumps({"inputs": [{"name": "image", "shape": [1, 1, 8, 8], "datatype": "BF16", "data": [1]}]}).encode(),
         400, "input 'image': datatype 'BF16' is not supported"),
        ("/v2/models/digits/infer", [], json.dumps({"inputs": [{"name": "image", "shape": [1, 1], "datatype": "BYTES", "data": ["a"]}]}).encode(),
         400, "input 'image': expected float32"),
        ("/v2/models/digits/infer", [], json.dumps({"inputs": [{"name": "image", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [1.0] * 10}]}).encode(),
         400, "input 'image': shape [1, 1, 8, 8] has 64 elements but data has 10"),
        ("/v2/models/digits/infer", [], json.dumps({"inputs": [{"name": "image", "shape": [1, 1, 8, 8], "datatype": "INT64", "data": [1] * 64}]}).encode(),
         400, "model 'digits':"),
        ("/v2/models/digits/infer", ["-H", "Inference-Header-Content-Length: 99999"], b"{}", 400,
         "Inference-Header-Content-Length '99999' must be an integer no larger than the body (2 bytes)"),
    ]
    for path, args, data, want_status, fragment in cases:
        status, headers, body = curl(agent, path, *args, data=data)
        reply = json.loads(body)
        assert status == want_status and set(reply) == {"error"} and fragment in reply["error"], (path, status, reply)
    # binary data that does not add up to what the header declares
    header = json.dumps({"inputs": [{"name": "image", "shape": [1, 1, 8, 8], "datatype": "FP32", "parameters": {"binary_data_size": 256}}]}).encode()
    status, _, body = curl(agent, "/v2/models/digits/infer", "-H", f"Inference-Header-Content-Length: {len(header)}",
                           data=header + struct.pack("<64f", *range(64)) + b"xx")  # fmt: skip
    assert status == 400 and "holds 258 bytes of binary tensor data but the inputs' binary_data_size add up to 256" in json.loads(body)["error"]


def test_server_not_ready_while_a_model_has_no_bundle(agent_config: Callable[..., Path], tmp_path: Path, fleet_keys: tuple[Path, Path]) -> None:
    path = agent_config(models={"names": ["digits", "later"], "default": "digits"})
    bundle = make_model_bundle(tmp_path / "src" / "digits", "digits")
    sign_bundle(bundle, fleet_keys[0])
    assert agent_main(["install", str(bundle), "--config", str(path), "--model", "digits"]) == 0
    with AgentService(load_config(path)) as service:
        triton = httpclient.InferenceServerClient(url=service.api_address)
        try:
            assert triton.is_server_live() and not triton.is_server_ready()
            assert triton.is_model_ready("digits") and not triton.is_model_ready("later")
            with pytest.raises(InferenceServerException) as info:
                triton.infer("later", [tensor("image", images(1), binary=True)])
            assert "model 'later' has no bundle loaded" in info.value.message()
        finally:
            triton.close()
