"""The gRPC server's event loop (``agent/oip_grpc_loop.py``): concurrent ``ModelInfer`` calls to a batching model
run together (fewer runner calls than requests), each answered with its own result; a request that fails the
model's checks fails alone; a blocked repository load does not hold up inference. A real agent, real ONNX
Runtime, grpcio clients (Triton's generated stubs and ``tritonclient``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.bundle.signing import sign_bundle
from edgekit_runtime.agent.cli import main as agent_main
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.service import AgentService
from tests.runtime.agent_service.model_bundles import make_model_bundle, reference_slow
from tests.runtime.agent_service.test_batching_serving import concurrently

grpc = pytest.importorskip("grpc", reason="grpcio is the runtime's grpc extra: pip install 'edgekit-runtime[grpc]' (scripts/setup.sh)")
pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is in the dev extra (scripts/setup.sh)")
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402

REPEATS = 600  # chained MatMuls: a runner call long enough that clients queue behind it
CLIENTS, EACH = 12, 5


@pytest.fixture
def agent(agent_config: Callable[..., Path], tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Iterator[AgentService]:
    path = agent_config(models={"names": ["slow"], "default": "slow"}, batching={"max_delay_ms": 0.5},
                        api={"address": "127.0.0.1:0", "grpc": {"listen": "127.0.0.1:0"}})  # fmt: skip
    bundle = make_model_bundle(tmp_path / "src" / "slow", "slow", repeats=REPEATS)
    sign_bundle(bundle, fleet_keys[0])
    assert agent_main(["install", str(bundle), "--config", str(path), "--model", "slow"]) == 0
    with AgentService(load_config(path)) as service:
        yield service


def request(x: np.ndarray) -> Any:
    message = service_pb2.ModelInferRequest(model_name="slow", raw_input_contents=[x.tobytes()])
    message.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    return message


def answer(response: Any) -> np.ndarray:
    return np.frombuffer(response.raw_output_contents[0], "<f4").reshape(list(response.outputs[0].shape))


def statistics(stub: Any) -> tuple[int, int]:
    stats = stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name="slow"), timeout=20).model_stats[0]
    return stats.inference_count, stats.execution_count


def test_concurrent_calls_run_together_each_with_its_own_answer(agent: AgentService) -> None:
    address = agent.grpc.bound_address

    def client(index: int) -> None:
        with grpc.insecure_channel(address) as channel:  # a channel each, as separate clients have
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            for turn in range(EACH):
                x = np.random.default_rng(index * 100 + turn).standard_normal((1, 256)).astype(np.float32)
                response, call = stub.ModelInfer.with_call(request(x), timeout=60)
                np.testing.assert_allclose(answer(response), reference_slow(x, REPEATS), rtol=1e-3, atol=1e-3)
                trailing = dict(call.trailing_metadata())
                assert float(trailing["x-edgekit-compute-ms"]) > 0 and float(trailing["x-edgekit-queue-ms"]) >= 0

    concurrently(CLIENTS, client)
    with grpc.insecure_channel(address) as channel:
        inferences, executions = statistics(service_pb2_grpc.GRPCInferenceServiceStub(channel))
    assert inferences == CLIENTS * EACH
    assert executions < inferences, f"{inferences} requests in {executions} runner calls: none ran together"


def test_a_failing_request_fails_alone(agent: AgentService) -> None:
    """Every third client sends a tensor of the wrong width: INVALID_ARGUMENT for it, answers for the rest,
    whichever pass each lands in."""
    address = agent.grpc.bound_address
    outcomes: dict[int, Any] = {}

    def client(index: int) -> None:
        with grpc.insecure_channel(address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            for turn in range(EACH):
                width = 128 if index % 3 == 0 else 256
                x = np.random.default_rng(index * 100 + turn).standard_normal((1, width)).astype(np.float32)
                try:
                    outcomes[index * 100 + turn] = (x, answer(stub.ModelInfer(request(x), timeout=60)))
                except grpc.RpcError as err:
                    outcomes[index * 100 + turn] = (x, err)

    concurrently(CLIENTS, client)
    assert len(outcomes) == CLIENTS * EACH
    for key, (x, outcome) in outcomes.items():
        if (key // 100) % 3 == 0:
            assert isinstance(outcome, grpc.RpcError) and outcome.code() == grpc.StatusCode.INVALID_ARGUMENT, key
            assert "model 'slow':" in outcome.details()
        else:
            assert isinstance(outcome, np.ndarray), (key, outcome)
            np.testing.assert_allclose(outcome, reference_slow(x, REPEATS), rtol=1e-3, atol=1e-3)


def test_a_blocked_repository_load_does_not_hold_up_inference(agent: AgentService, monkeypatch: pytest.MonkeyPatch) -> None:
    slot = agent.models.get("slow")
    entered, release = threading.Event(), threading.Event()
    load = slot.load

    def held_load(*args: Any, **kwargs: Any) -> Any:  # the re-verification of a large bundle, say
        entered.set()
        assert release.wait(60), "the test never released the load"
        return load(*args, **kwargs)

    monkeypatch.setattr(slot, "load", held_load)
    x = np.random.default_rng(7).standard_normal((2, 256)).astype(np.float32)
    with grpc.insecure_channel(agent.grpc.bound_address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        loading = stub.RepositoryModelLoad.future(service_pb2.RepositoryModelLoadRequest(model_name="slow"), timeout=60)
        try:
            assert entered.wait(20), "the load RPC never reached the model"
            for _ in range(3):  # answered while the load is held
                np.testing.assert_allclose(answer(stub.ModelInfer(request(x), timeout=10)), reference_slow(x, REPEATS), rtol=1e-3, atol=1e-3)
            assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=10).live
            assert not loading.done()
        finally:
            release.set()
        loading.result(timeout=60)  # the load then finishes, and the model is served
        assert stub.ModelReady(service_pb2.ModelReadyRequest(name="slow"), timeout=10).ready
        np.testing.assert_allclose(answer(stub.ModelInfer(request(x), timeout=10)), reference_slow(x, REPEATS), rtol=1e-3, atol=1e-3)


def test_unix_socket_bind_errors_and_the_message_limit(agent: AgentService, tmp_path: Path) -> None:
    """The server on a Unix socket answers inference; a taken port is an AgentConfigError naming api.grpc.listen;
    a request over api.max_request_mb is grpcio's RESOURCE_EXHAUSTED, and the server goes on answering."""
    import socket
    import tempfile
    from dataclasses import replace

    from edgekit_runtime.agent.config_types import GrpcConfig, parse_api_address
    from edgekit_runtime.agent.errors import AgentConfigError
    from edgekit_runtime.agent.oip_grpc import OipGrpcServer

    x = np.random.default_rng(3).standard_normal((1, 256)).astype(np.float32)
    api = agent.config.api
    folder = Path(tempfile.mkdtemp(prefix="g", dir="/tmp"))  # a socket path must stay under ~100 characters
    on_socket = OipGrpcServer(agent.models, GrpcConfig(listen=parse_api_address(f"unix:{folder / 'grpc.sock'}")), api).start()
    try:
        assert on_socket.bound_address == f"unix:{folder / 'grpc.sock'}"
        with grpc.insecure_channel(on_socket.bound_address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            np.testing.assert_allclose(answer(stub.ModelInfer(request(x), timeout=20)), reference_slow(x, REPEATS), rtol=1e-3, atol=1e-3)
    finally:
        on_socket.stop(grace_s=1.0)
    with socket.socket() as taken:  # a plain listener: grpcio's SO_REUSEPORT cannot share its port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(AgentConfigError, match=rf"api.grpc.listen: cannot listen on 127.0.0.1:{port}"):
            OipGrpcServer(agent.models, GrpcConfig(listen=parse_api_address(f"127.0.0.1:{port}")), api).start()
    small = OipGrpcServer(agent.models, GrpcConfig(listen=parse_api_address("127.0.0.1:0")), replace(api, max_request_bytes=4096)).start()
    try:
        with grpc.insecure_channel(small.bound_address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            big = np.zeros((8, 256), np.float32)  # 8 KiB of input
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelInfer(request(big), timeout=20)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            np.testing.assert_allclose(answer(stub.ModelInfer(request(x), timeout=20)), reference_slow(x, REPEATS), rtol=1e-3, atol=1e-3)
    finally:
        small.stop(grace_s=1.0)
