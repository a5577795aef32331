"""The Open Inference Protocol's ``GRPCInferenceService`` (the agent's optional grpc extra), driven by
Triton's own gRPC client (``tritonclient[grpc]``) against a real agent serving two models; golden outputs
from numpy, the same numbers as the HTTP ``/v2`` path."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit_runtime import __version__ as AGENT_VERSION
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.errors import AgentConfigError
from edgekit_runtime.agent.service import AgentService
from tests.runtime.agent_service.model_bundles import embedder_inputs, reference_embedding, serving_models
from tests.runtime.tiny_bundle import reference_logits

grpc = pytest.importorskip("grpc", reason="grpcio is the runtime's grpc extra: pip install 'edgekit-runtime[grpc]' (scripts/setup.sh)")
grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is in the dev extra (scripts/setup.sh)")
httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is in the dev extra (scripts/setup.sh)")
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from edgekit_runtime.agent.oip_grpc import INSTALL_HINT, load_messages  # noqa: E402

MODELS = ["digits", "embedder"]
VERSION = "1"  # each model slot serves version 1
BUNDLE_VERSION = "1735689600000"  # the bundles' created time in ms: their bundle_version, accepted as a version too
EXTENSIONS = ["binary_tensor_data", "classification", "model_configuration", "statistics", "model_repository"]
PROTO_DIR = Path(__file__).parents[3] / "runtime" / "edgekit_runtime" / "agent" / "proto"


@pytest.fixture
def agent(agent_config: Callable[..., Path], tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Iterator[AgentService]:
    with serving_models(agent_config, tmp_path, fleet_keys[0], MODELS, api={"address": "127.0.0.1:0", "grpc": {"listen": "127.0.0.1:0"}}) as service:
        yield service


@pytest.fixture
def client(agent: AgentService) -> Iterator[Any]:
    triton = grpcclient.InferenceServerClient(url=agent.grpc.bound_address)
    yield triton
    triton.close()


def images(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 1, 8, 8)).astype(np.float32)


def tensor(name: str, array: np.ndarray) -> Any:
    item = grpcclient.InferInput(name, list(array.shape), {"float32": "FP32", "int64": "INT64"}[array.dtype.name])
    item.set_data_from_numpy(array)  # raw_input_contents
    return item


def test_health_and_metadata(client: Any) -> None:
    assert client.is_server_live() and client.is_server_ready()
    metadata = client.get_server_metadata()
    assert (metadata.name, metadata.version, list(metadata.extensions)) == ("edgekit-agent", AGENT_VERSION, EXTENSIONS)
    for name in MODELS:
        assert client.is_model_ready(name) and client.is_model_ready(name, model_version=VERSION)
        assert client.is_model_ready(name, model_version=BUNDLE_VERSION)
    assert not client.is_model_ready("digits", model_version="7") and not client.is_model_ready("nope")
    digits = client.get_model_metadata("digits")
    assert (digits.name, list(digits.versions), digits.platform) == ("digits", [VERSION], "edgekit_onnxruntime")
    assert [(t.name, t.datatype, list(t.shape)) for t in digits.inputs] == [("image", "FP32", [-1, 1, 8, 8])]
    assert [(t.name, t.datatype, list(t.shape)) for t in digits.outputs] == [("logits", "FP32", [-1, 10])]
    embedder = client.get_model_metadata("embedder", model_version=VERSION)
    assert [(t.name, t.datatype, list(t.shape)) for t in embedder.inputs] == [("input_ids", "INT64", [-1, -1]),
                                                                              ("attention_mask", "INT64", [-1, -1])]  # fmt: skip


def test_infer_raw_contents_matches_golden_and_the_http_path(agent: AgentService, client: Any) -> None:
    x = images(3, seed=1)
    digits = client.infer("digits", [tensor("image", x)], outputs=[grpcclient.InferRequestedOutput("logits")], request_id="g-1")
    response = digits.get_response()
    assert (response.model_name, response.model_version, response.id) == ("digits", VERSION, "g-1")
    assert len(response.raw_output_contents) == 1  # raw, as Triton answers
    logits = digits.as_numpy("logits")
    np.testing.assert_allclose(logits, reference_logits(x), rtol=1e-4, atol=1e-4)
    feeds = embedder_inputs(4, seed=3)
    embedder = client.infer("embedder", [tensor(name, value) for name, value in feeds.items()], model_version=VERSION)
    result = embedder.as_numpy("sentence_embedding")
    assert result.dtype == np.float32 and result.shape == (4, 8)
    np.testing.assert_allclose(result, reference_embedding(**feeds), rtol=1e-4, atol=1e-5)
    # the HTTP /v2 binary path answers with the very same numbers, from the same serving core
    http = httpclient.InferenceServerClient(url=agent.api_address)
    item = httpclient.InferInput("image", list(x.shape), "FP32")
    item.set_data_from_numpy(x, binary_data=True)
    try:
        np.testing.assert_array_equal(http.infer("digits", [item]).as_numpy("logits"), logits)
    finally:
        http.close()
    assert agent.models.get("digits").server.totals().requests >= 2


def test_infer_typed_contents_with_tritons_own_messages(agent: AgentService) -> None:
    """Typed ``contents`` (FP32, INT64) sent with tritonclient's generated messages over a plain stub."""
    x = images(2, seed=5)
    feeds = embedder_inputs(2, seed=6)
    with grpc.insecure_channel(agent.grpc.bound_address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="digits", id="typed")
        request.inputs.add(name="image", datatype="FP32", shape=[2, 1, 8, 8]).contents.fp32_contents.extend(x.reshape(-1).tolist())
        response, call = stub.ModelInfer.with_call(request, timeout=20)
        assert response.id == "typed" and [o.name for o in response.outputs] == ["logits"]
        logits = np.frombuffer(response.raw_output_contents[0], "<f4").reshape(list(response.outputs[0].shape))
        np.testing.assert_allclose(logits, reference_logits(x), rtol=1e-4, atol=1e-4)
        trailing = dict(call.trailing_metadata())
        assert float(trailing["x-edgekit-compute-ms"]) > 0 and float(trailing["x-edgekit-queue-ms"]) >= 0
        request = service_pb2.ModelInferRequest(model_name="embedder")
        for name, value in feeds.items():
            request.inputs.add(name=name, datatype="INT64", shape=list(value.shape)).contents.int64_contents.extend(value.reshape(-1).tolist())
        response = stub.ModelInfer(request, timeout=20)
        result = np.frombuffer(response.raw_output_contents[0], "<f4").reshape(2, 8)
        np.testing.assert_allclose(result, reference_embedding(**feeds), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("call", "code", "fragment"),
    [
        (lambda c: c.infer("nope", [tensor("image", images(1))]), "NOT_FOUND", "unknown model 'nope'; this agent serves: digits, embedder"),
        (lambda c: c.infer("digits", [tensor("image", images(1))], model_version="3"), "NOT_FOUND",
         "model 'digits' has no version '3'; it serves version 1 (bundle version 1735689600000)"),
        (lambda c: c.get_model_metadata("nope"), "NOT_FOUND", "unknown model 'nope'"),
        (lambda c: c.infer("digits", [tensor("image", images(1).reshape(1, 64))]), "INVALID_ARGUMENT", "model 'digits':"),
        (lambda c: c.infer("digits", [tensor("pixels", images(1))]), "INVALID_ARGUMENT", "model 'digits':"),
        (lambda c: c.infer("digits", [tensor("image", images(1))], outputs=[grpcclient.InferRequestedOutput("probs")]),
         "INVALID_ARGUMENT", "outputs[0]: the model has no output 'probs'; its outputs: logits"),
    ],
    ids=["unknown_model", "unknown_version", "metadata_unknown", "wrong_shape", "unknown_input", "unknown_output"],
)
def test_errors_are_grpc_status_codes_with_the_reason(client: Any, call: Callable[[Any], Any], code: str, fragment: str) -> None:
    with pytest.raises(InferenceServerException) as info:
        call(client)
    assert info.value.status() == f"StatusCode.{code}"
    assert fragment in info.value.message()


def test_malformed_requests_are_invalid_argument(agent: AgentService) -> None:
    with grpc.insecure_channel(agent.grpc.bound_address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        cases = []
        short = service_pb2.ModelInferRequest(model_name="digits", raw_input_contents=[b"\0" * 12])
        short.inputs.add(name="image", datatype="FP32", shape=[1, 1, 8, 8])
        cases.append((short, "input 'image': raw_input_contents[0] holds 12 bytes, FP32[1, 1, 8, 8] needs 256"))
        wrong_field = service_pb2.ModelInferRequest(model_name="digits")
        wrong_field.inputs.add(name="image", datatype="FP32", shape=[1, 1, 8, 8]).contents.int_contents.extend([1] * 64)
        cases.append((wrong_field, "input 'image': no data; a FP32 tensor's values go in contents.fp32_contents"))
        cases.append((service_pb2.ModelInferRequest(model_name="digits"), "the request has no inputs"))
        fp16 = service_pb2.ModelInferRequest(model_name="digits")
        fp16.inputs.add(name="image", datatype="FP16", shape=[1])
        cases.append((fp16, "FP16 has no typed contents; send it in raw_input_contents"))
        for request, fragment in cases:
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelInfer(request, timeout=20)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and fragment in info.value.details()
        statistics = channel.unary_unary("/inference.GRPCInferenceService/CudaSharedMemoryStatus")  # not served
        with pytest.raises(grpc.RpcError) as info:
            statistics(b"", timeout=20)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_messages_match_tritons_field_for_field() -> None:
    """Every field of the agent's messages (from its own descriptor) is tritonclient's, same number and type: the
    same on the wire (Triton adds fields the protocol lacks, e.g. InferParameter.double_param; they are ignored)."""
    ours = load_messages()
    assert len(ours) == 35 and len(ours["ModelInferRequest"].DESCRIPTOR.fields) == 7
    for name, cls in ours.items():  # the configuration's messages are in Triton's model_config.proto
        theirs = getattr(service_pb2, name, None) or getattr(model_config_pb2, name)
        theirs = theirs.DESCRIPTOR

        def fields(descriptor: Any) -> dict[str, tuple[int, int, bool]]:
            # protobuf 7 dropped FieldDescriptor.label for is_repeated
            return {f.name: (f.number, f.type, f.is_repeated if hasattr(f, "is_repeated") else f.label == f.LABEL_REPEATED)
                    for f in descriptor.fields}  # fmt: skip

        def assert_subset(mine: Any, triton: Any, where: str) -> None:
            ours_fields, triton_fields = fields(mine), fields(triton)
            assert {key: triton_fields.get(key) for key in ours_fields} == ours_fields, where

        assert_subset(cls.DESCRIPTOR, theirs, name)
        for nested in cls.DESCRIPTOR.nested_types:
            if not nested.GetOptions().map_entry:
                assert_subset(nested, theirs.nested_types_by_name[nested.name], f"{name}.{nested.name}")


def test_committed_descriptor_is_the_proto_compiled(tmp_path: Path) -> None:
    protoc = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools compiles grpc_service.proto (pip install grpcio-tools)")
    from google.protobuf.descriptor_pb2 import FileDescriptorSet

    out = tmp_path / "grpc_service.desc"
    assert protoc.main(["protoc", f"-I{PROTO_DIR}", f"--descriptor_set_out={out}", "grpc_service.proto"]) == 0
    compiled = FileDescriptorSet.FromString(out.read_bytes())
    committed = FileDescriptorSet.FromString((PROTO_DIR / "grpc_service.desc").read_bytes())
    assert compiled == committed, "regenerate grpc_service.desc (the command is in grpc_service.proto)"


def test_grpc_without_the_extra_is_a_config_error(agent_config: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    path = agent_config(api={"address": "127.0.0.1:0", "grpc": {"listen": "127.0.0.1:0"}})
    monkeypatch.setitem(sys.modules, "grpc", None)  # as if grpcio were not installed
    with pytest.raises(AgentConfigError) as info:
        AgentService(load_config(path))
    assert "api.grpc is set but the gRPC extra is not installed" in info.value.message
    assert INSTALL_HINT in (info.value.hint or "")


def test_grpc_is_off_by_default_and_refuses_a_non_loopback_address(agent_config: Callable[..., Path]) -> None:
    assert load_config(agent_config()).api.grpc is None
    with pytest.raises(AgentConfigError, match="api.grpc.listen: '0.0.0.0:8001' is not a loopback address"):
        load_config(agent_config(api={"address": "127.0.0.1:0", "grpc": {"listen": "0.0.0.0:8001"}}))
    with pytest.raises(AgentConfigError, match="api.grpc.port: is not a known key"):
        load_config(agent_config(api={"address": "127.0.0.1:0", "grpc": {"port": 8001}}))


def test_the_grpc_server_stops_with_the_agent(agent_config: Callable[..., Path]) -> None:
    path = agent_config(api={"address": "127.0.0.1:0", "grpc": {"listen": "127.0.0.1:0"}})
    with AgentService(load_config(path)) as service:
        address = service.grpc.bound_address
        with grpc.insecure_channel(address) as channel:
            live = service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(service_pb2.ServerLiveRequest(), timeout=20)
            assert live.live
            ready = service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerReady(service_pb2.ServerReadyRequest(), timeout=20)
            assert not ready.ready  # no bundle installed
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as info:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(service_pb2.ServerLiveRequest(), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
