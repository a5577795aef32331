"""Triton's model configuration, statistics and model repository extensions, the ``classification`` output
parameter, request ids, repeated outputs and compressed bodies, driven by Triton's own HTTP and gRPC clients
(``tritonclient``) against a real agent serving two models, with golden outputs from numpy."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.bundle.signing import sign_bundle
from edgekit_runtime.agent.cli import main as agent_main
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.service import AgentService
from tests.runtime.agent_service.model_bundles import make_model_bundle, oip_clients, serving_models
from tests.runtime.tiny_bundle import reference_logits

grpc = pytest.importorskip("grpc", reason="grpcio is the runtime's grpc extra: pip install 'edgekit-runtime[grpc]' (scripts/setup.sh)")
grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is in the dev extra (scripts/setup.sh)")
httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is in the dev extra (scripts/setup.sh)")
from tritonclient.utils import InferenceServerException  # noqa: E402

MODELS = ["digits", "embedder"]
BUNDLE_VERSION = "1735689600000"
BATCH_BOUND = 128  # make_model_bundle's batch dim: 1..128


@pytest.fixture
def agent(agent_config: Callable[..., Path], tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Iterator[AgentService]:
    with serving_models(agent_config, tmp_path, fleet_keys[0], MODELS, api={"address": "127.0.0.1:0", "grpc": {"listen": "127.0.0.1:0"}}) as service:
        yield service


@pytest.fixture
def clients(agent: AgentService) -> Iterator[tuple[Any, Any]]:
    with oip_clients(agent) as pair:
        yield pair


def images(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 1, 8, 8)).astype(np.float32)


def http_image(x: np.ndarray, *, binary: bool = True) -> Any:
    item = httpclient.InferInput("image", list(x.shape), "FP32")
    item.set_data_from_numpy(x, binary_data=binary)
    return item


def grpc_image(x: np.ndarray) -> Any:
    item = grpcclient.InferInput("image", list(x.shape), "FP32")
    item.set_data_from_numpy(x)
    return item


def post(agent: AgentService, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://{agent.api_address}{path}", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **headers})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=20) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


# -- model configuration -----------------------------------------------------------------------------------


def test_model_config_from_the_bundle_over_http_and_grpc(clients: tuple[Any, Any]) -> None:
    http, rpc = clients
    config = http.get_model_config("digits")
    assert (config["name"], config["platform"], config["backend"], config["max_batch_size"]) == \
        ("digits", "edgekit_onnxruntime", "onnxruntime", BATCH_BOUND)  # fmt: skip
    assert config["input"] == [{"name": "image", "data_type": "TYPE_FP32", "dims": [1, 8, 8]}]  # the batch dim left out
    assert config["output"] == [{"name": "logits", "data_type": "TYPE_FP32", "dims": [10]}]
    assert config["instance_group"] == [{"name": "digits_0", "kind": "KIND_CPU", "count": 1}]
    assert "dynamic_batching" not in config  # the agent config has no batching section
    assert config["parameters"]["bundle_version"] == {"string_value": BUNDLE_VERSION}
    assert http.get_model_config("embedder", model_version="1")["input"][1] == \
        {"name": "attention_mask", "data_type": "TYPE_INT64", "dims": [-1]}  # fmt: skip
    answer = rpc.get_model_config("digits").config
    assert (answer.name, answer.max_batch_size, answer.platform) == ("digits", BATCH_BOUND, "edgekit_onnxruntime")
    assert [(t.name, t.data_type, list(t.dims)) for t in answer.input] == [("image", 11, [1, 8, 8])]  # 11: TYPE_FP32
    assert [(t.name, list(t.dims)) for t in answer.output] == [("logits", [10])]
    assert (answer.instance_group[0].kind, answer.instance_group[0].count) == (2, 1)  # KIND_CPU
    assert answer.parameters["manifest_sha256"].string_value == config["parameters"]["manifest_sha256"]["string_value"]
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        http.get_model_config("nope")
    with pytest.raises(InferenceServerException, match="has no version '2'"):
        rpc.get_model_config("digits", model_version="2")


def test_model_config_with_dynamic_batching(agent_config: Callable[..., Path], tmp_path: Path, fleet_keys: tuple[Path, Path]) -> None:
    path = agent_config(batching={"max_batch": 16, "max_delay_ms": 2.5})
    bundle = make_model_bundle(tmp_path / "src" / "digits", "digits")
    sign_bundle(bundle, fleet_keys[0])
    assert agent_main(["install", str(bundle), "--config", str(path)]) == 0
    with AgentService(load_config(path)) as service:
        http = httpclient.InferenceServerClient(url=service.api_address)
        try:
            config = http.get_model_config("digits")
        finally:
            http.close()
    assert config["max_batch_size"] == 16 and config["dynamic_batching"] == {"max_queue_delay_microseconds": 2500}


# -- statistics ----------------------------------------------------------------------------------------------


def test_statistics_count_requests_items_and_times(agent: AgentService, clients: tuple[Any, Any]) -> None:
    http, rpc = clients
    for seed in range(3):
        http.infer("digits", [http_image(images(2, seed))])
    rpc.infer("digits", [grpc_image(images(1, 9))])
    stats = http.get_inference_statistics("digits")["model_stats"]
    assert [(s["name"], s["version"]) for s in stats] == [("digits", "1")]
    digits = stats[0]
    assert (digits["inference_count"], digits["execution_count"]) == (7, 4)  # items, runner calls
    inference = digits["inference_stats"]
    assert inference["success"]["count"] == inference["queue"]["count"] == inference["compute_infer"]["count"] == 4
    assert inference["success"]["ns"] >= inference["queue"]["ns"] + inference["compute_infer"]["ns"] > 0
    assert inference["fail"] == {"count": 0, "ns": 0}
    sizes = {entry["batch_size"]: entry["compute_infer"]["count"] for entry in digits["batch_stats"]}
    assert sizes == {1: 1, 2: 3}
    assert digits["last_inference"] > 1_700_000_000_000  # milliseconds since the epoch
    every = rpc.get_inference_statistics()  # no name: every model
    assert sorted(s.name for s in every.model_stats) == MODELS
    over_grpc = next(s for s in every.model_stats if s.name == "digits")
    assert (over_grpc.inference_count, over_grpc.execution_count, over_grpc.inference_stats.success.count) == (7, 4, 4)
    assert over_grpc.inference_stats.compute_infer.ns == inference["compute_infer"]["ns"]
    assert agent.models.get("embedder").server.protocol_statistics("embedder", "1")["inference_count"] == 0


# -- model repository ----------------------------------------------------------------------------------------


def test_repository_index_unload_and_load(agent: AgentService, clients: tuple[Any, Any]) -> None:
    http, rpc = clients
    assert http.get_model_repository_index() == [
        {"name": "digits", "version": "1", "state": "READY", "reason": f"bundle version {BUNDLE_VERSION}"},
        {"name": "embedder", "version": "1", "state": "READY", "reason": f"bundle version {BUNDLE_VERSION}"}]  # fmt: skip
    slot = agent.models.get("embedder")
    on_disk = slot.store.current
    rpc.unload_model("embedder")
    assert not http.is_model_ready("embedder") and not rpc.is_model_ready("embedder")
    assert slot.store.current == on_disk and on_disk is not None and (on_disk / "model.onnx").is_file()  # kept on disk
    index = {entry.name: entry for entry in rpc.get_model_repository_index().models}
    assert (index["embedder"].state, index["digits"].state) == ("UNAVAILABLE", "READY")
    assert "unloaded; its bundle is on disk" in index["embedder"].reason
    status, body = post(agent, "/v2/repository/index", json.dumps({"ready": True}).encode(), {})
    assert status == 200 and [entry["name"] for entry in json.loads(body)] == ["digits"]
    with pytest.raises(InferenceServerException, match="has no bundle loaded"):
        http.infer("embedder", [httpclient.InferInput("input_ids", [1, 4], "INT64").set_data_from_numpy(np.ones((1, 4), np.int64))])
    http.load_model("embedder")
    assert http.is_model_ready("embedder") and agent.models.get("embedder").served.path == on_disk
    x = images(2, 4)
    np.testing.assert_allclose(rpc.infer("digits", [grpc_image(x)]).as_numpy("logits"), reference_logits(x), rtol=1e-4, atol=1e-4)


def test_load_verifies_the_bundle_again(agent: AgentService, clients: tuple[Any, Any]) -> None:
    http, rpc = clients
    slot = agent.models.get("digits")
    http.unload_model("digits")
    model = slot.store.current / "model.onnx"
    model.write_bytes(model.read_bytes()[:-1] + b"\0")  # one byte changed on disk while unloaded
    with pytest.raises(InferenceServerException, match="load failed: no bundle of model 'digits'"):
        rpc.load_model("digits")
    assert not http.is_model_ready("digits")
    assert http.get_model_repository_index()[0]["state"] == "UNAVAILABLE"


# -- classification, ids, repeated outputs ---------------------------------------------------------------------


def top_classes(logits: np.ndarray, count: int) -> list[list[int]]:
    return [list(np.argsort(-row, kind="stable")[:count]) for row in logits]


@pytest.mark.parametrize("binary", [False, True])
def test_classification_over_http(clients: tuple[Any, Any], binary: bool) -> None:
    http, _ = clients
    x = images(3, seed=2)
    result = http.infer("digits", [http_image(x)], outputs=[httpclient.InferRequestedOutput("logits", binary_data=binary, class_count=3)])
    labels = result.as_numpy("logits")
    assert labels.shape == (3, 3) and result.get_output("logits")["datatype"] == "BYTES"
    expected = reference_logits(x)
    for row, wanted, reference in zip(labels, top_classes(expected, 3), expected):
        parts = [item.decode().split(":") if isinstance(item, bytes) else item.split(":") for item in row]
        assert [int(index) for _, index in parts] == wanted
        np.testing.assert_allclose([float(score) for score, _ in parts], reference[wanted], atol=1e-5)


def test_classification_over_grpc_and_limits(clients: tuple[Any, Any]) -> None:
    _, rpc = clients
    x = images(2, seed=3)
    result = rpc.infer("digits", [grpc_image(x)], outputs=[grpcclient.InferRequestedOutput("logits", class_count=20)])
    labels = result.as_numpy("logits")
    assert labels.shape == (2, 10)  # more classes asked for than there are: every class
    assert [[int(item.split(b":")[1]) for item in row] for row in labels] == top_classes(reference_logits(x), 10)
    with pytest.raises(InferenceServerException, match="asked for twice"):
        rpc.infer("digits", [grpc_image(x)], outputs=[grpcclient.InferRequestedOutput("logits")] * 2)
    for field, value in (("double_param", 3.0), ("uint64_param", 3)):  # as Triton: an int64_param only (before: ignored)
        output = grpcclient.InferRequestedOutput("logits", class_count=3)
        setattr(output._get_tensor().parameters["classification"], field, value)
        with pytest.raises(InferenceServerException, match=f"classification must be an int64_param .*got {field}"):
            rpc.infer("digits", [grpc_image(x)], outputs=[output])


def test_request_id_must_be_a_string_and_outputs_named_once(agent: AgentService) -> None:
    x = images(1).reshape(-1).tolist()
    inputs = [{"name": "image", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": x}]
    status, body = post(agent, "/v2/models/digits/infer", json.dumps({"id": 7, "inputs": inputs}).encode(), {})
    assert status == 400 and "id must be a string" in json.loads(body)["error"]
    twice = {"inputs": inputs, "outputs": [{"name": "logits"}, {"name": "logits"}]}
    status, body = post(agent, "/v2/models/digits/infer", json.dumps(twice).encode(), {})
    assert status == 400 and "outputs[1]: output 'logits' is asked for twice" in json.loads(body)["error"]
    bad_count = {"inputs": inputs, "outputs": [{"name": "logits", "parameters": {"classification": 0}}]}
    status, body = post(agent, "/v2/models/digits/infer", json.dumps(bad_count).encode(), {})
    assert status == 400 and "classification must be an integer >= 1" in json.loads(body)["error"]
    status, body = post(agent, "/v2/models/digits/infer", json.dumps({"id": "r-9", "inputs": inputs}).encode(), {})
    assert status == 200 and json.loads(body)["id"] == "r-9" and json.loads(body)["model_version"] == "1"


# -- compressed bodies ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_from_tritonclient(agent: AgentService, clients: tuple[Any, Any], algorithm: str) -> None:
    http, _ = clients
    x = images(4, seed=5)
    for binary in (True, False):
        result = http.infer("digits", [http_image(x, binary=binary)], request_compression_algorithm=algorithm)
        np.testing.assert_allclose(result.as_numpy("logits"), reference_logits(x), rtol=1e-4, atol=1e-4)
    assert agent.api.body_budget.reserved_bytes == 0  # the decoded bytes were given back too


def test_compressed_bodies_are_bounded_and_checked(agent: AgentService) -> None:
    bomb = gzip.compress(b"[" + b" " * (8 * 2**20) + b"]")  # 8 MiB of spaces in about 8 KiB
    status, body = post(agent, "/v2/models/digits/infer", bomb, {"Content-Encoding": "gzip"})
    assert status == 413 and "decodes to more than" in json.loads(body)["error"]
    status, body = post(agent, "/v2/models/digits/infer", b"not gzip at all", {"Content-Encoding": "gzip"})
    assert status == 400 and "not valid gzip data" in json.loads(body)["error"]
    status, body = post(agent, "/v2/models/digits/infer", zlib.compress(b"{}")[:-3], {"Content-Encoding": "deflate"})
    assert status == 400 and "ends before its end marker" in json.loads(body)["error"]
    status, body = post(agent, "/v2/models/digits/infer", b"{}", {"Content-Encoding": "br"})
    assert status == 415 and "Content-Encoding 'br' is not supported" in json.loads(body)["error"]
    assert agent.api.body_budget.reserved_bytes == 0
