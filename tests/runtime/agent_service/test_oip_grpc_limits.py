"""The gRPC server's message limit follows what the served models can need: a request larger than that is
refused by grpcio from its length prefix, before its bytes are buffered, and the limit grows (the server
restarting on the same address) when a model that needs more comes to be served. A real agent and grpcio."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit_runtime.agent import oip_grpc
from edgekit_runtime.agent.service import AgentService
from tests.runtime.agent_service.model_bundles import serving_models
from tests.runtime.tiny_bundle import reference_logits

grpc = pytest.importorskip("grpc", reason="grpcio is the runtime's grpc extra: pip install 'edgekit-runtime[grpc]' (scripts/setup.sh)")
pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is in the dev extra (scripts/setup.sh)")
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402


@pytest.fixture
def agent(agent_config: Callable[..., Path], tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Iterator[AgentService]:
    api = {"address": "127.0.0.1:0", "grpc": {"listen": "127.0.0.1:0"}}
    with serving_models(agent_config, tmp_path, fleet_keys[0], ["digits", "embedder"], api=api) as service:
        yield service


def infer(stub: Any, images: np.ndarray) -> Any:
    message = service_pb2.ModelInferRequest(model_name="digits", raw_input_contents=[images.tobytes()])
    message.inputs.add(name="image", datatype="FP32", shape=list(images.shape))
    return stub.ModelInfer(message, timeout=30)


def refusal(stub: Any, images: np.ndarray) -> Any:
    with pytest.raises(grpc.RpcError) as info:
        infer(stub, images)
    return info.value


def test_a_request_larger_than_the_models_can_need_is_refused_from_its_length(agent: AgentService) -> None:
    # digits takes at most 128 images (32 KiB), the embedder less than 600 KB even as JSON: the least limit holds
    assert agent.grpc.message_limit == oip_grpc.MIN_MESSAGE_BYTES < agent.config.api.max_request_bytes
    too_many = np.zeros((5 * 4096, 1, 8, 8), np.float32)  # 5 MiB
    with grpc.insecure_channel(agent.grpc.bound_address, options=[("grpc.max_send_message_length", 2**30)]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        refused = refusal(stub, too_many)
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.details()
        assert str(oip_grpc.MIN_MESSAGE_BYTES) in refused.details()
        good = np.random.default_rng(1).standard_normal((2, 1, 8, 8)).astype(np.float32)  # and it goes on answering
        reply = infer(stub, good)
        got = np.frombuffer(reply.raw_output_contents[0], "<f4").reshape(list(reply.outputs[0].shape))
        np.testing.assert_allclose(got, reference_logits(good), rtol=1e-4, atol=1e-5)


def test_the_limit_grows_when_a_model_that_needs_more_is_loaded(agent: AgentService, monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedder is unloaded and loaded again over gRPC itself (RepositoryModelUnload / Load): as the load is
    served, the repository reports the change, and with the least limit raised past 5 MiB (standing in for a model
    with larger inputs) the server restarts on the same address after the load's call has been answered."""
    address, before = agent.grpc.bound_address, agent.grpc.message_limit
    assert before == oip_grpc.MIN_MESSAGE_BYTES
    larger = 2 * before
    too_many = np.zeros((5 * 4096, 1, 8, 8), np.float32)
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 2**30)]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        stub.RepositoryModelUnload(service_pb2.RepositoryModelUnloadRequest(model_name="embedder"), timeout=30)
        monkeypatch.setattr(oip_grpc, "MIN_MESSAGE_BYTES", larger)
        stub.RepositoryModelLoad(service_pb2.RepositoryModelLoadRequest(model_name="embedder"), timeout=60)  # answered
    deadline = time.monotonic() + oip_grpc.RESTART_GRACE_S + 20
    while agent.grpc.message_limit != larger and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (agent.grpc.message_limit, agent.grpc.bound_address) == (larger, address)
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 2**30)]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        refused = refusal(stub, too_many)  # now the model's own check answers it: the message came in whole
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and "image" in refused.details(), refused.details()
        ready = stub.ModelReady(service_pb2.ModelReadyRequest(name="embedder"), timeout=30)
        assert ready.ready
