"""Inference requests a review found answered 500 (or gRPC UNKNOWN), against a real agent serving HTTP and gRPC:
a shape with a zero dim whose other dims multiply past what numpy can shape at the datatype's item size, a
``datatype`` that is a list or an object, and a binary request whose model is unloaded while its body arrives;
and a failure in a gRPC method that is not the protocol's error (INTERNAL with a message, not UNKNOWN)."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.runtime.agent_service.model_bundles import serving_models
from tests.runtime.agent_service.test_api_event_loop import MODEL, binary_request, images, raw_request
from tests.runtime.agent_service.test_api_event_loop_hostile import on_the_loop, read_reply
from tests.runtime.tiny_bundle import reference_logits

grpc = pytest.importorskip("grpc", reason="grpcio is the runtime's grpc extra: pip install 'edgekit-runtime[grpc]' (scripts/setup.sh)")
pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is in the dev extra (scripts/setup.sh)")
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402

from edgekit_runtime.agent import oip_grpc  # noqa: E402

#: no elements, but 2**62 of them were they not zero: 2**64 bytes as FP32, past numpy's 2**63
EMPTY_YET_TOO_LARGE = [2**31, 2**31, 0]
TOO_LARGE = b"is larger than any tensor can be"


@pytest.fixture
def agent(agent_config: Callable[..., Path], tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Iterator[Any]:
    api = {"address": "127.0.0.1:0", "grpc": {"listen": "127.0.0.1:0"}}
    with serving_models(agent_config, tmp_path, fleet_keys[0], [MODEL], batching={"max_delay_ms": 0.5}, api=api) as service:
        yield service


def _address(agent: Any) -> tuple[str, int]:
    host, port = agent.api_address.rsplit(":", 1)
    return host, int(port)


def _request(header: dict[str, Any], binary: bytes = b"") -> bytes:
    """A whole HTTP/1.1 inference request: ``header`` as JSON, then ``binary`` (binary tensor data) when given."""
    body = json.dumps(header).encode()
    headers = {"Host": "127.0.0.1", "Content-Type": "application/json", "Content-Length": str(len(body) + len(binary))}
    if binary or any("binary_data_size" in (tensor.get("parameters") or {}) for tensor in header["inputs"]):
        headers.update({"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(body))})
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\n{head}\r\n".encode() + body + binary


def _answers(sock: socket.socket, requests: list[bytes]) -> list[tuple[int, bytes]]:
    with sock.makefile("rb") as stream:
        replies = []
        for request in requests:
            sock.sendall(request)
            status, _, body = read_reply(stream)
            replies.append((status, body))
        return replies


def _image(shape: list[int], datatype: Any, **fields: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "image", "shape": shape, "datatype": datatype, **fields}]}


def test_an_empty_shape_too_large_for_numpy_is_400_on_the_threads_and_the_loop(agent: Any) -> None:
    requests = [_request(_image(EMPTY_YET_TOO_LARGE, "FP32", parameters={"binary_data_size": 0})),
                _request(_image(EMPTY_YET_TOO_LARGE, "FP32", data=[])),
                _request(_image(EMPTY_YET_TOO_LARGE, "FP64", data=[])),
                _request(_image(EMPTY_YET_TOO_LARGE, "BYTES", data=[]))]  # fmt: skip
    with socket.create_connection(_address(agent), timeout=30) as sock:  # a fresh connection: a thread serves it
        on_threads = _answers(sock, requests)
    with on_the_loop(agent) as sock:
        on_the_loop_ = _answers(sock, requests)
    for status, body in on_threads + on_the_loop_:  # before: 500 (numpy's ValueError from reshape)
        assert status == 400 and b"input 'image': shape [2147483648, 2147483648, 0] " + TOO_LARGE in body, body
    with socket.create_connection(_address(agent), timeout=30) as sock:  # the largest shape numpy takes at 8 bytes
        [(status, body)] = _answers(sock, [_request(_image([2**60 - 1, 0], "FP64", data=[]))])
    assert status == 400 and b"got float64[1152921504606846975, 0]" in body, body  # the model's own answer: it was made


def test_an_empty_shape_too_large_for_numpy_is_invalid_argument_over_grpc(agent: Any) -> None:
    with grpc.insecure_channel(agent.grpc.bound_address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        raw = service_pb2.ModelInferRequest(model_name=MODEL, raw_input_contents=[b""])
        raw.inputs.add(name="image", datatype="FP32", shape=EMPTY_YET_TOO_LARGE)
        typed = service_pb2.ModelInferRequest(model_name=MODEL)
        typed.inputs.add(name="image", datatype="FP32", shape=EMPTY_YET_TOO_LARGE)
        for message in (raw, typed):
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelInfer(message, timeout=30)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()  # before: UNKNOWN
            assert TOO_LARGE.decode() in info.value.details()


def test_a_bug_in_a_grpc_method_is_internal_with_a_message_not_unknown(agent: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(request: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(oip_grpc, "_decode_inputs", broken)
    with grpc.insecure_channel(agent.grpc.bound_address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        message = service_pb2.ModelInferRequest(model_name=MODEL, raw_input_contents=[images(1, 1).tobytes()])
        message.inputs.add(name="image", datatype="FP32", shape=[1, 1, 8, 8])
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(message, timeout=30)
    assert info.value.code() == grpc.StatusCode.INTERNAL  # before: UNKNOWN "Unexpected <class 'RuntimeError'>: a bug"
    assert info.value.details() == oip_grpc.INTERNAL_ERROR


@pytest.mark.parametrize("datatype", [["FP32"], {"FP32": 1}])
def test_a_datatype_that_is_not_a_string_is_400_naming_the_input(agent: Any, datatype: Any) -> None:
    array = images(1, 2)
    requests = [_request(_image([1, 1, 8, 8], datatype, data=array.reshape(-1).tolist())),
                _request(_image([1, 1, 8, 8], datatype, parameters={"binary_data_size": array.nbytes}), array.tobytes())]  # fmt: skip
    with socket.create_connection(_address(agent), timeout=30) as sock:
        on_threads = _answers(sock, requests)
    with on_the_loop(agent) as sock:
        on_the_loop_ = _answers(sock, requests + [raw_request(array)])
    expected = f"input 'image': datatype {datatype!r} is not supported".encode()
    for status, body in on_threads + on_the_loop_[:2]:  # before: 500 (unhashable type)
        assert status == 400 and expected in body, body
    assert on_the_loop_[2][0] == 200  # and the connection goes on serving


def _control(agent: Any, action: str) -> None:
    connection = http.client.HTTPConnection(*_address(agent), timeout=30)
    try:
        connection.request("POST", f"/v2/repository/models/{MODEL}/{action}", b"{}", {"Content-Type": "application/json"})
        reply = connection.getresponse()
        assert reply.status == 200, reply.read()
    finally:
        connection.close()


@pytest.mark.parametrize("where", ["thread", "loop"])
def test_a_binary_request_whose_model_is_unloaded_while_its_body_arrives_is_503(agent: Any, where: str) -> None:
    array = images(1, 3)
    body, headers = binary_request(array)
    request = raw_request(array)
    assert request.endswith(body) and "Inference-Header-Content-Length" in headers
    sock = on_the_loop(agent) if where == "loop" else socket.create_connection(_address(agent), timeout=30)
    with sock, sock.makefile("rb") as stream:
        sock.sendall(request[:-20])  # the head and most of the body: its model had a bundle when the head came
        _control(agent, "unload")
        sock.sendall(request[-20:])
        status, _, reply = read_reply(stream)
    assert status == 503 and f"model '{MODEL}' has no bundle loaded".encode() in reply, reply  # before: 500 on a thread
    _control(agent, "load")
    with on_the_loop(agent) as sock:  # serving again once loaded
        sock.sendall(raw_request(array))
        with sock.makefile("rb") as stream:
            status, reply_headers, reply = read_reply(stream)
    assert status == 200, reply
    got = np.frombuffer(reply[int(reply_headers["inference-header-content-length"]) :], "<f4").reshape(1, 10)
    np.testing.assert_allclose(got, reference_logits(array), rtol=1e-4, atol=1e-5)
