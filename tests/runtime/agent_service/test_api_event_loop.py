"""The local API's event loop (``agent/http_loop.py``): kept-alive OIP inference connections move to it from
their threads, concurrent requests run together (one runner call per batch), and whatever it does not serve
itself goes back to a thread with the bytes it read, to meet the API's usual checks and answers."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.runtime.agent_service.model_bundles import serving_models
from tests.runtime.tiny_bundle import reference_logits

MODEL = "digits"


@pytest.fixture
def agent(agent_config: Callable[..., Path], tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Iterator[Any]:
    with serving_models(agent_config, tmp_path, fleet_keys[0], [MODEL], batching={"max_delay_ms": 0.5}) as service:
        yield service


def images(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 1, 8, 8)).astype(np.float32)


def binary_request(array: np.ndarray) -> tuple[bytes, dict[str, str]]:
    """A binary-tensor inference request for ``array`` (input ``image``) asking for binary outputs."""
    header = json.dumps({"inputs": [{"name": "image", "shape": list(array.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": array.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()  # fmt: skip
    return header + array.tobytes(), {"Inference-Header-Content-Length": str(len(header)),
                                      "Content-Type": "application/octet-stream"}  # fmt: skip


def logits_of(reply: http.client.HTTPResponse) -> np.ndarray:
    body = reply.read()
    assert reply.status == 200, body
    return binary_logits(body, int(reply.getheader("Inference-Header-Content-Length")))


def binary_logits(body: bytes, header_size: int) -> np.ndarray:
    """The one output of a binary reply ``body`` whose JSON header is its first ``header_size`` bytes."""
    (output,) = json.loads(body[:header_size])["outputs"]
    return np.frombuffer(body[header_size:], dtype=np.float32).reshape(output["shape"])


def raw_request(array: np.ndarray) -> bytes:
    """The whole HTTP/1.1 request (head and body) of :func:`binary_request`, as a client writes it to its socket."""
    body, headers = binary_request(array)
    head = "".join(f"{name}: {value}\r\n" for name, value in {**headers, "Content-Length": str(len(body)), "Host": "127.0.0.1"}.items())
    return f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\n{head}\r\n".encode() + body


def connect(agent: Any) -> http.client.HTTPConnection:
    host, port = agent.api_address.rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=30)


def wait_for(predicate: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_kept_alive_inference_moves_to_the_loop_and_other_requests_go_back_to_a_thread(agent: Any) -> None:
    connection = connect(agent)
    path = f"/v2/models/{MODEL}/infer"
    for seed in range(3):
        array = images(1, seed)
        body, headers = binary_request(array)
        connection.request("POST", path, body, headers)
        np.testing.assert_allclose(logits_of(connection.getresponse()), reference_logits(array), rtol=1e-4, atol=1e-5)
        assert wait_for(lambda: agent.api.loop_connections == 1)
    # a GET on the same connection: handed back to a thread, answered as before, then inference again
    connection.request("GET", f"/v2/models/{MODEL}/ready")
    reply = connection.getresponse()
    assert (reply.status, json.loads(reply.read())) == (200, {"name": MODEL, "ready": True})
    array = images(2, 7)
    body, headers = binary_request(array)
    connection.request("POST", path, body, headers)
    np.testing.assert_allclose(logits_of(connection.getresponse()), reference_logits(array), rtol=1e-4, atol=1e-5)
    assert wait_for(lambda: agent.api.loop_connections == 1)
    # errors the loop answers itself, in the protocol's format, keeping the connection
    connection.request("POST", path, b'{"inputs": [{"name": "image", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}',
                       {"Content-Type": "application/json"})  # fmt: skip
    reply = connection.getresponse()
    assert reply.status == 400 and "image" in json.loads(reply.read())["error"]
    connection.request("POST", path, b"{not json", {"Content-Type": "application/json"})
    reply = connection.getresponse()
    assert reply.status == 400 and "not valid JSON" in json.loads(reply.read())["error"]
    # refusals from the head go back to the thread, which answers them as it always did
    connection.request("POST", path, b"x" * 10, {"Content-Type": "text/plain"})
    reply = connection.getresponse()
    assert reply.status == 415, reply.read()
    reply.read()
    connection.request("POST", "/v2/models/nope/infer", body, headers)
    reply = connection.getresponse()
    assert reply.status == 404 and "nope" in json.loads(reply.read())["error"]
    connection.close()
    assert wait_for(lambda: agent.api.loop_connections == 0)


def test_a_request_split_across_a_pause_is_served_by_a_thread(agent: Any) -> None:
    host, port = agent.api_address.rsplit(":", 1)
    array = images(1, 3)
    request = raw_request(array)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        for _ in range(2):  # the first moves the connection to the loop; the second arrives in two parts
            sock.sendall(request[:40])
            time.sleep(0.5)  # past PARTIAL_HAND_BACK_S: the loop hands the connection back with the 40 bytes
            sock.sendall(request[40:])
            reply = http.client.HTTPResponse(sock)
            reply.begin()
            np.testing.assert_allclose(logits_of(reply), reference_logits(array), rtol=1e-4, atol=1e-5)


def test_concurrent_clients_are_batched_by_the_loop(agent: Any) -> None:
    clients, rounds = 8, 30
    failures: list[str] = []
    start = threading.Barrier(clients)

    def client(index: int) -> None:
        connection = connect(agent)
        start.wait()
        for step in range(rounds):
            array = images(1, index * 1000 + step)
            body, headers = binary_request(array)
            connection.request("POST", f"/v2/models/{MODEL}/infer", body, headers)
            got = logits_of(connection.getresponse())
            if not np.allclose(got, reference_logits(array), rtol=1e-4, atol=1e-5):
                failures.append(f"client {index} step {step}: {got} != {reference_logits(array)}")
        connection.close()

    server = agent.models.default.server
    before = server.totals()
    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[:3]
    totals = server.totals()
    requests, calls = totals.requests - before.requests, totals.runner_calls - before.runner_calls
    assert requests == clients * rounds
    assert calls < requests, f"{requests} requests in {calls} runner calls: no batch formed"
