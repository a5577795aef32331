"""The local API against web pages and greedy clients, over raw sockets to a real API with a real ONNX
Runtime session: a rebound ``Host`` (421), a foreign ``Origin`` (403), simple-request content types (415),
a body larger than the model can need (413 before it is read), more JSON values than the inputs hold (400
before ``json.loads``), and 64 slow connections from one client that no longer starve ``/v1/health``."""

from __future__ import annotations

import http.client
import json
import socket
import time
from pathlib import Path

import pytest

from edgekit_runtime.agent.api import AgentApi
from edgekit_runtime.agent.serving import InferenceServer

MODEL = "tiny-linear-x86-64-cpu-fp32"
MB = 1024 * 1024


def connect(api: AgentApi, source: str | None = None) -> socket.socket:
    host, port = api.bound_address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0) if source else None)


def exchange(api: AgentApi, request: bytes) -> tuple[int, dict]:
    with connect(api) as sock:
        sock.sendall(request)
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.getheader("Content-Type") == "application/json"
        return response.status, json.loads(response.read())


def infer_json(rows: int = 1) -> bytes:
    return json.dumps({"inputs": {"image": {"dtype": "float32", "shape": [rows, 1, 8, 8], "data": [[[[0.5] * 8] * 8]] * rows}}}).encode()


def post(path: str, body: bytes, *headers: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n" % (path.encode(), b"".join(h + b"\r\n" for h in headers), len(body)) + body


def test_a_rebound_host_name_is_refused_with_421_and_configured_names_are_served(server: InferenceServer) -> None:
    with AgentApi(server, "127.0.0.1:0", allowed_hosts=("jetson-01.local",)) as api:
        port = api.bound_address.rsplit(":", 1)[1]
        status, payload = exchange(api, b"GET /v1/health HTTP/1.1\r\nHost: rebind.attacker.example:%s\r\n\r\n" % port.encode())
        assert status == 421 and payload["error"] == "unknown_host", payload
        assert f"Host 'rebind.attacker.example:{port}' is not a name this server answers to" in payload["message"]
        assert "jetson-01.local" in payload["message"] and "api.allowed_hosts" in payload["hint"]
        # the Open Inference Protocol's own error object under /v2, and before the body is read
        status, payload = exchange(api, post(f"/v2/models/{MODEL}/infer", infer_json(), b"Host: evil.example",
                                             b"Content-Type: application/json"))  # fmt: skip
        assert status == 421 and set(payload) == {"error"} and payload["error"].startswith("Host 'evil.example' is not a name")
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "[::1]", "app.localhost", "JETSON-01.local:" + port):
            status, payload = exchange(api, b"GET /v1/health HTTP/1.1\r\nHost: %s\r\n\r\n" % host.encode())
            assert (status, payload["status"]) == (200, "ok"), host
        status, payload = exchange(api, post("/v1/infer", infer_json(), f"Host: jetson-01.local:{port}".encode(),
                                             b"Content-Type: application/json"))  # fmt: skip
        assert status == 200 and payload["outputs"]["logits"]["shape"] == [1, 10]


def test_foreign_origins_are_refused_with_403(server: InferenceServer) -> None:
    with AgentApi(server, "127.0.0.1:0") as api:
        for origin in (b"https://ads.example.com", b"null", b"http://127.0.0.1.evil.example:8470"):
            status, payload = exchange(api, post("/v1/infer", infer_json(), b"Host: 127.0.0.1", b"Origin: " + origin,
                                                 b"Content-Type: application/json"))  # fmt: skip
            assert status == 403 and payload["error"] == "forbidden_origin", (origin, payload)
            assert f"requests from web pages at {origin.decode()!r} are refused" in payload["message"]
        status, payload = exchange(api, post("/v1/infer", infer_json(), b"Host: 127.0.0.1", b"Origin: http://localhost:3000",
                                             b"Content-Type: application/json"))  # fmt: skip
        assert status == 200, payload


@pytest.mark.parametrize("content_type", [b"text/plain;charset=UTF-8", b"application/x-www-form-urlencoded",
                                          b"multipart/form-data; boundary=x"])  # fmt: skip
def test_simple_request_content_types_are_refused_with_415(server: InferenceServer, content_type: bytes) -> None:
    with AgentApi(server, "127.0.0.1:0") as api:
        kind = content_type.split(b";")[0].decode()
        status, payload = exchange(api, post("/v1/infer", infer_json(), b"Host: localhost", b"Content-Type: " + content_type))
        assert status == 415 and payload["error"] == "unsupported_media_type"
        assert payload["message"] == f"Content-Type {kind!r} is not accepted here (a type any web page may send without asking)"
        status, payload = exchange(api, post(f"/v2/models/{MODEL}/infer", b'{"inputs": []}', b"Host: localhost",
                                             b"Content-Type: " + content_type))  # fmt: skip
        assert status == 415 and payload["error"].startswith(f"Content-Type {kind!r} is not accepted here"), payload


def test_a_body_larger_than_the_model_can_need_is_refused_before_it_is_read(server: InferenceServer) -> None:
    with AgentApi(server, "127.0.0.1:0") as api:
        for path, key in (("/v1/infer", "message"), (f"/v2/models/{MODEL}/infer", "error")):
            with connect(api) as sock:  # 60 MB claimed, not one byte of it sent
                sock.sendall(b"POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % (path.encode(), 60 * MB))  # fmt: skip
                response = http.client.HTTPResponse(sock)
                response.begin()
                payload = json.loads(response.read())
            assert response.status == 413, payload
            # 8192 values (batch <= 128 of 1x8x8) x 32 bytes + 64 KiB
            assert f"request body of {60 * MB} bytes is more than model {MODEL!r} can need (327680 bytes at most for " \
                   "float32[batch, 1, 8, 8] (batch in 1..128)" in payload[key], payload  # fmt: skip


def test_more_json_values_than_the_inputs_hold_are_refused_before_parsing(server: InferenceServer) -> None:
    with AgentApi(server, "127.0.0.1:0") as api:
        body = b'{"inputs": {"image": {"dtype": "float32", "data": [' + b"0," * 100_000 + b'0]}}}'  # 200 KB, under the size bound
        status, payload = exchange(api, post("/v1/infer", body, b"Host: localhost", b"Content-Type: application/json"))
        assert status == 400 and payload["error"] == "input_signature"
        assert payload["message"].startswith(f"request body holds 100001 commas, more than the inputs of model {MODEL!r} can take "
                                             "(8192 values at most")  # fmt: skip
        body = b'{"inputs": [{"name": "image", "datatype": "FP32", "shape": [1], "data": ' + b"[" * 20_000 + b"]" * 20_000 + b"}]}"
        status, payload = exchange(api, post(f"/v2/models/{MODEL}/infer", body, b"Host: localhost", b"Content-Type: application/json"))
        assert status == 400 and payload["error"].startswith(f"request body holds 20002 arrays, more than the inputs of model {MODEL!r}"), payload


def _slow_connection(api: AgentApi, source: str | None = None) -> socket.socket:
    sock = connect(api, source)
    sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")  # and nothing more
    return sock


def _health(api: AgentApi, source: str | None = None) -> tuple[int, dict]:
    with connect(api, source) as sock:
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, json.loads(response.read())


def _wait(condition, timeout_s: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_64_slow_connections_from_one_client_do_not_keep_health_at_503(server: InferenceServer) -> None:
    with AgentApi(server, "127.0.0.1:0", max_connections=64, header_timeout_s=60) as api:
        hog = [_slow_connection(api) for _ in range(64)]
        assert _wait(lambda: api.open_connections == 64)
        time.sleep(1.2)  # past the grace: these connections have waited a second without a whole request
        for round_ in range(3):
            status, payload = _health(api)
            assert (status, payload["status"]) == (200, "ok"), (round_, payload)
            # the hog tops its connections up again, round after round; it lost the longest-waiting one
            evicted = hog.pop(0)
            response = http.client.HTTPResponse(evicted)
            response.begin()
            assert response.status == 503 and json.loads(response.read())["error"] == "evicted"
            evicted.close()
            assert _wait(lambda: api.open_connections == 63)  # the health check's connection has ended
            hog.append(_slow_connection(api))
            time.sleep(1.1)
        assert api.evicted_connections == 3 and api.refused_connections == 0
        for sock in hog:
            sock.close()


def test_the_client_holding_most_connections_gives_up_a_slot_first(server: InferenceServer) -> None:
    with AgentApi(server, "127.0.0.1:0", max_connections=8, header_timeout_s=60) as api:
        patient = _slow_connection(api)  # another client's connection, waiting the longest of all
        time.sleep(0.1)
        hog = [_slow_connection(api, source="127.0.0.2") for _ in range(7)]
        assert _wait(lambda: api.open_connections == 8)
        time.sleep(1.2)
        assert _health(api)[0] == 200
        patient.sendall(b"x\r\n\r\n")  # the patient client's request completes: it kept its slot
        response = http.client.HTTPResponse(patient)
        response.begin()
        assert response.status == 200 and json.loads(response.read())["status"] == "ok"
        assert api.evicted_connections == 1
        for sock in [patient, *hog]:
            sock.close()


def test_503_busy_within_the_grace_and_a_stalled_body_evicted_after_it(server: InferenceServer) -> None:
    """Whole headers with the body still to come: no whole request yet. Within the grace (a second) every slot is
    busy (503 busy); past it the longest-waiting is evicted for the new connection, as for a connection stalled in
    its headers (before: a trickled body held its slot for body_timeout_s, every other client refused)."""
    with AgentApi(server, "127.0.0.1:0", max_connections=2, body_timeout_s=60) as api:
        held = []
        for _ in range(2):
            sock = connect(api)
            sock.sendall(b"POST /v1/infer HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
            held.append(sock)
        assert _wait(lambda: api.open_connections == 2)
        status, payload = _health(api)
        assert status == 503 and payload["error"] == "busy"
        assert "already serves 2 connections, its limit, each with a request in progress" in payload["message"]
        time.sleep(1.2)
        status, payload = _health(api)
        assert status == 200 and api.evicted_connections == 1
        for sock in held:
            sock.close()


def test_allowed_hosts_come_from_the_agent_config(server: InferenceServer, tmp_path: Path) -> None:
    from edgekit_runtime.agent.config import load_config
    from edgekit_runtime.agent.errors import AgentConfigError

    def config(hosts: object) -> Path:
        path = tmp_path / "agent.yaml"
        path.write_text(json.dumps({"device_id": "dev-1", "fleet": "lab", "bundles": {"dir": str(tmp_path / "b"), "allow_unsigned": True},
                                    "api": {"address": "127.0.0.1:0", "allowed_hosts": hosts},
                                    "telemetry": {"spool": {"path": str(tmp_path / "spool.db")}}}))  # fmt: skip
        return path

    api_config = load_config(config(["jetson-01.local"])).api
    assert api_config.allowed_hosts == ("jetson-01.local",)
    with AgentApi.from_config(server, api_config) as api:
        assert exchange(api, b"GET /v1/health HTTP/1.1\r\nHost: jetson-01.local\r\n\r\n")[0] == 200
        assert exchange(api, b"GET /v1/health HTTP/1.1\r\nHost: jetson-02.local\r\n\r\n")[0] == 421
    with pytest.raises(AgentConfigError) as caught:
        load_config(config(["jetson-01.local:8470"]))
    assert "api.allowed_hosts: expected a list of host names without ports, got ['jetson-01.local:8470']" in caught.value.message
