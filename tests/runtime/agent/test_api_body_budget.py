"""The API's budget for the request bodies of all connections together, over raw sockets to a real API
with a real ONNX Runtime session: a body that does not fit beside those in flight is refused 503 with
``Retry-After`` from its ``Content-Length`` (``/v1`` and ``/v2``), one over the whole budget 413; the bytes
come back when a request is answered, whatever its outcome; the default follows the agent's memory budget."""

from __future__ import annotations

import http.client
import json
import socket
import time
from pathlib import Path

import pytest

from edgekit_runtime.agent.api import AgentApi
from edgekit_runtime.agent.body_budget import MIB
from edgekit_runtime.agent.config import parse_config
from edgekit_runtime.agent.errors import AgentConfigError
from edgekit_runtime.agent.serving import InferenceServer

MODEL = "tiny-linear-x86-64-cpu-fp32"
BODY = json.dumps({"inputs": {"image": {"dtype": "float32", "shape": [1, 1, 8, 8], "data": [[[[0.5] * 8] * 8]]}}}).encode()
OIP_BODY = json.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": [0.5] * 64}]}).encode()


def connect(api: AgentApi) -> socket.socket:
    host, port = api.bound_address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def head(path: str, length: int) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (path.encode(), length)


def answer(sock: socket.socket) -> tuple[int, dict, http.client.HTTPResponse]:
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, json.loads(response.read()), response


def exchange(api: AgentApi, path: str, body: bytes) -> tuple[int, dict, http.client.HTTPResponse]:
    with connect(api) as sock:
        sock.sendall(head(path, len(body)) + body)
        return answer(sock)


def wait_reserved(api: AgentApi, expected: int) -> None:
    deadline = time.monotonic() + 10
    while api.body_budget.reserved_bytes != expected:
        assert time.monotonic() < deadline, f"{api.body_budget.reserved_bytes} bytes reserved, expected {expected}"
        time.sleep(0.02)


def test_a_body_that_does_not_fit_beside_those_in_flight_gets_503_and_fits_once_they_are_answered(server: InferenceServer) -> None:
    budget = len(BODY) + len(OIP_BODY) // 2
    with AgentApi(server, "127.0.0.1:0", max_inflight_body_bytes=budget) as api:
        with connect(api) as held:  # headers and half the body: its whole Content-Length is reserved
            held.sendall(head("/v1/infer", len(BODY)) + BODY[: len(BODY) // 2])
            wait_reserved(api, len(BODY))
            status, payload, response = exchange(api, "/v1/infer", BODY)
            assert (status, payload["error"], response.getheader("Retry-After")) == (503, "busy_bodies", "1"), payload
            assert payload["message"] == (f"request body of {len(BODY)} bytes does not fit beside the {len(BODY)} bytes of bodies "
                                          f"the agent serves now ({budget} at most, api.max_inflight_body_mb)")  # fmt: skip
            assert "Retry-After" in payload["hint"]
            status, payload, response = exchange(api, f"/v2/models/{MODEL}/infer", OIP_BODY)
            assert (status, response.getheader("Retry-After")) == (503, "1") and set(payload) == {"error"}, payload
            assert payload["error"].startswith(f"request body of {len(OIP_BODY)} bytes does not fit beside")
            held.sendall(BODY[len(BODY) // 2 :])
            status, payload, _ = answer(held)
            assert status == 200 and payload["outputs"]["logits"]["shape"] == [1, 10]
        wait_reserved(api, 0)
        assert exchange(api, "/v1/infer", BODY)[0] == 200
        assert exchange(api, f"/v2/models/{MODEL}/infer", OIP_BODY)[0] == 200
        assert api.body_budget.refused_bodies == 2


def test_a_body_larger_than_the_whole_budget_is_413_and_every_outcome_gives_its_bytes_back(server: InferenceServer) -> None:
    with AgentApi(server, "127.0.0.1:0", max_inflight_body_bytes=len(BODY)) as api:
        status, payload, response = exchange(api, "/v1/infer", BODY + b" ")
        assert (status, payload["error"], response.getheader("Retry-After")) == (413, "too_large", None), payload
        assert payload["message"] == (f"request body of {len(BODY) + 1} bytes is more than the agent holds for all request "
                                      f"bodies at once ({len(BODY)} bytes, api.max_inflight_body_mb)")  # fmt: skip
        # a malformed body (400), a wrong shape (400), a body cut short: each gives its bytes back
        assert exchange(api, "/v1/infer", b"{" * len(BODY))[0] == 400
        assert exchange(api, "/v1/infer", BODY.replace(b"[1, 1, 8, 8]", b"[1, 1, 8, 9]"))[0] == 400
        with connect(api) as sock:
            sock.sendall(head("/v1/infer", len(BODY)) + BODY[:10])
            wait_reserved(api, len(BODY))
        wait_reserved(api, 0)
        for _ in range(3):  # requests one after another fit each time: the bytes are free before the reply leaves
            assert exchange(api, "/v1/infer", BODY)[0] == 200
        with connect(api) as sock:  # and kept alive on one connection
            for _ in range(3):
                sock.sendall(head("/v1/infer", len(BODY)) + BODY)
                assert answer(sock)[0] == 200
        assert api.body_budget.reserved_bytes == 0 and api.body_budget.refused_bodies == 0


def _config(tmp_path: Path, api: dict, models: dict | None = None) -> dict:
    data = {"device_id": "dev-1", "fleet": "lab", "bundles": {"dir": str(tmp_path / "b"), "allow_unsigned": True},
            "api": {"address": "127.0.0.1:0", **api}, "telemetry": {"spool": {"path": str(tmp_path / "spool.db")}}}  # fmt: skip
    if models is not None:
        data["models"] = models
    return data


def test_the_budget_is_a_quarter_of_the_memory_budget_unless_the_config_names_it(server: InferenceServer, tmp_path: Path) -> None:
    file = tmp_path / "agent.yaml"
    assert parse_config(_config(tmp_path, {}), file=file).api.max_inflight_body_bytes == 128 * MIB  # a quarter of 512 MiB
    models = {"names": ["detector"], "memory_budget_mb": 2048}
    assert parse_config(_config(tmp_path, {}, models), file=file).api.max_inflight_body_bytes == 512 * MIB
    named = parse_config(_config(tmp_path, {"max_inflight_body_mb": 40}, models), file=file)
    assert named.api.max_inflight_body_bytes == 40 * MIB
    assert AgentApi.from_config(server, named.api).body_budget.limit_bytes == 40 * MIB
    with pytest.raises(AgentConfigError) as caught:
        parse_config(_config(tmp_path, {"max_inflight_body_mb": 0}), file=file)
    assert "api.max_inflight_body_mb" in caught.value.message
