"""The local API against slow, greedy and malformed clients, over real sockets and a real ONNX Runtime
session: bodies are read as they arrive (memory follows the bytes received, not Content-Length), and
every limit answers with a status and a reason."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from edgekit_runtime.agent.api import AgentApi
from edgekit_runtime.agent.client import AgentClient
from edgekit_runtime.agent.serving import InferenceServer
from edgekit_runtime.agent.wire import BINARY_CONTENT_TYPE, encode_binary

MB = 1024 * 1024




def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def connect(api: AgentApi) -> socket.socket:
    host, port = api.bound_address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def reply(sock: socket.socket) -> tuple[int, dict]:
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, json.loads(response.read())


def post(api: AgentApi, body: bytes, content_type: str = "application/json", accept: str | None = None) -> tuple[int, dict, dict]:
    host, port = api.bound_address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        headers = {"Content-Type": content_type, **({"Accept": accept} if accept else {})}
        connection.request("POST", "/v1/infer", body=body, headers=headers)
        response = connection.getresponse()
        raw = response.read()
        return response.status, json.loads(raw), dict(response.getheaders())  # strict: json.loads(NaN) would pass
    finally:
        connection.close()


def test_sixteen_64_mb_claims_do_not_allocate_64_mb_each(server: InferenceServer) -> None:
    """The tiny model's inputs need at most 320 KiB as JSON: each 64 MB claim is refused from its header."""
    with AgentApi(server, "127.0.0.1:0", max_request_bytes=64 * MB) as api:
        before = rss_mb()
        sockets = []
        for _ in range(16):
            sock = connect(api)
            sock.sendall(b"POST /v1/infer HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n{" % (64 * MB))  # fmt: skip
            sockets.append(sock)
        for sock in sockets:
            status, payload = reply(sock)
            assert status == 413 and payload["error"] == "too_large", payload
            assert f"request body of {64 * MB} bytes is more than model 'tiny-linear-x86-64-cpu-fp32' can need" in payload["message"]
        grown = rss_mb() - before
        for sock in sockets:
            sock.close()
        # 16 x 64 MB preallocated would be over 1 GB
        assert grown < 48, f"RSS grew {grown:.0f} MB for 16 connections that each sent one body byte"


def test_a_body_over_the_limit_is_refused_before_it_is_read(server: InferenceServer) -> None:
    with AgentApi(server, "127.0.0.1:0", max_request_bytes=1 * MB) as api:
        sock = connect(api)
        sock.sendall(b"POST /v1/infer HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % (2 * MB))
        status, payload = reply(sock)  # no byte of the body was sent
        assert status == 413 and payload["error"] == "too_large"
        assert f"request body of {2 * MB} bytes is over the limit of {1 * MB}" in payload["message"]
        assert "api.max_request_mb" in payload["hint"]
        sock.close()


def test_slow_headers_and_bodies_are_cut_off_with_408(server: InferenceServer) -> None:
    with AgentApi(server, "127.0.0.1:0", header_timeout_s=0.6, body_timeout_s=0.6) as api:
        slow = connect(api)
        started = time.monotonic()
        slow.sendall(b"GET /v1/health HTTP/1.1\r\n")
        for _ in range(20):  # a header byte every 0.2 s: each recv is quick, the whole is not
            try:
                slow.sendall(b"X")
            except OSError:
                break
            time.sleep(0.2)
        status, payload = reply(slow)
        assert status == 408 and payload["error"] == "too_slow" and "headers did not arrive in time" in payload["message"]
        assert time.monotonic() - started < 3
        slow.close()

        body = connect(api)
        body.sendall(b"POST /v1/infer HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n{")
        status, payload = reply(body)
        assert status == 408 and "body did not arrive in time" in payload["message"]
        body.close()
        assert api.timed_out_connections == 2
        assert AgentClient(api.bound_address).health()["status"] == "ok"  # well-behaved clients are served


def test_headers_over_the_limit_answer_431(server: InferenceServer) -> None:
    with AgentApi(server, "127.0.0.1:0", max_header_bytes=4096) as api:
        sock = connect(api)
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n" + b"X-Pad: " + b"a" * 8000 + b"\r\n\r\n")
        status, payload = reply(sock)
        assert status == 431 and payload["error"] == "headers_too_large"
        assert "over the limit of 4096 bytes" in payload["message"] and "api.max_header_kb" in payload["hint"]
        sock.close()


def test_connections_past_the_cap_get_503(server: InferenceServer) -> None:
    with AgentApi(server, "127.0.0.1:0", max_connections=4) as api:
        held = [connect(api) for _ in range(4)]
        assert wait_until(lambda: api.open_connections == 4)
        extra = connect(api)
        status, payload = reply(extra)
        assert status == 503 and payload["error"] == "busy" and "4 connections, its limit" in payload["message"]
        assert "api.max_connections" in payload["hint"] and api.refused_connections == 1
        extra.close()
        held.pop().close()
        assert wait_until(lambda: api.open_connections == 3)
        assert AgentClient(api.bound_address).health()["status"] == "ok"
        for sock in held:
            sock.close()


@pytest.mark.parametrize(
    ("body", "content_type", "fragment"),
    [
        (b'{"inputs": {"image": {"dtype": "float32", "data": ' + b"[" * 5_000 + b"]" * 5_000 + b"}}}",
         "application/json", "nests JSON arrays or objects too deeply"),
        (b'{"inputs": {"image": {"dtype": "float32", "shape": [0, 1e30], "data": []}}}', "application/json", "malformed application/json request"),
        (b'{"inputs": {"image": {"dtype": "float32", "shape": [0, 1000000000000000000000000000000], "data": []}}}',
         "application/json", "malformed application/json request"),
        (b'{"inputs": {"image": {"dtype": "complex64", "data": [1]}}}', "application/json", "dtype 'complex64' cannot be sent"),
        (b'{"inputs": {"image": {"dtype": "float32", "data": [["a"]]}}}', "application/json", "do not fit dtype float32"),
    ],
    ids=["deep-json", "float-dim", "huge-dim", "dtype", "strings"],
)
def test_malformed_requests_answer_400_with_the_reason(server: InferenceServer, body: bytes, content_type: str, fragment: str) -> None:
    with AgentApi(server, "127.0.0.1:0") as api:
        status, payload, _ = post(api, body, content_type)
        assert status == 400 and payload["error"] == "input_signature" and fragment in payload["message"], payload


def exchange(api: AgentApi, request: bytes) -> tuple[int, dict, bool]:
    """Send raw bytes; the reply's status and JSON body, and whether the agent then closed the connection."""
    with connect(api) as sock:
        sock.sendall(request)
        response = http.client.HTTPResponse(sock)
        response.begin()  # a reply without a status line (http.server's HTTP/0.9 answers) fails here
        assert response.getheader("Content-Type") == "application/json", response.getheaders()
        payload = json.loads(response.read())
        closed = response.getheader("Connection") == "close" and sock.recv(1) == b""
        return response.status, payload, closed


GET_HEALTH = b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n"
POST_INFER = b"POST /v1/infer HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
LENGTH_HINT = "a request carries one Content-Length: its body's size in bytes"


@pytest.mark.parametrize(
    ("request_bytes", "status", "kind", "fragment"),
    [
        (b"GET /v1/health HTTP/1.1 and more\r\nHost: localhost\r\n\r\n", 400, "bad_request_line",
         "malformed request line 'GET /v1/health HTTP/1.1 and more': expected 3 words, METHOD /path HTTP/1.1"),
        (b"GET /v1/health\r\n\r\n", 400, "bad_request_line", "malformed request line 'GET /v1/health'"),
        (b"GET /v1/my health HTTP/1.1\r\n\r\n", 400, "bad_request_line", "expected 3 words"),
        (b"GET /v1/health FTP/1.1\r\n\r\n", 400, "bad_request_line", "malformed request line 'GET /v1/health FTP/1.1'"),
        (b"BREW /v1/health HTTP/1.1\r\nHost: localhost\r\n\r\n", 501, "method_not_implemented", "method 'BREW' is not implemented"),
        (b"get /v1/health HTTP/1.1\r\nHost: localhost\r\n\r\n", 501, "method_not_implemented", "method 'get' is not implemented"),
        (b"GET /v1/health HTTP/1.x\r\n\r\n", 400, "bad_request", "Bad request version ('HTTP/1.x')"),
        (b"GET /v1/health HTTP/2.0\r\n\r\n", 505, "http_version_not_supported", "Invalid HTTP version (2.0)"),
        (GET_HEALTH + b"X-Token abc\r\n\r\n", 400, "bad_header", "header line 'X-Token abc' is not 'Name: value'"),
        (GET_HEALTH + b"X-Token : abc\r\n\r\n", 400, "bad_header", "header line 'X-Token : abc' is not 'Name: value'"),
        (GET_HEALTH + b"X-Token: abc\r\n def\r\n\r\n", 400, "bad_header", "' def' is folded onto the one before"),
        (POST_INFER + b"Content-Length: -1\r\n\r\n", 400, "bad_content_length",
         "Content-Length '-1' is not a non-negative decimal number of bytes"),
        (POST_INFER + b"Content-Length: 1e3\r\n\r\n", 400, "bad_content_length", "Content-Length '1e3' is not"),
        (POST_INFER + b"Content-Length: 2, 2\r\n\r\n{}", 400, "bad_content_length", "Content-Length '2, 2' is not"),
        (POST_INFER + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}", 400, "bad_content_length",
         "2 Content-Length headers (2, 2); send one"),
        (GET_HEALTH + b"Content-Length: x\r\n\r\n", 400, "bad_content_length", "Content-Length 'x' is not"),
        (POST_INFER + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 411, "length_required",
         "chunked transfer encoding (Transfer-Encoding: chunked) is not supported"),
        (POST_INFER + b"Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 411,
         "length_required", "chunked transfer encoding"),  # never the Content-Length instead (request smuggling)
        (POST_INFER + b"Transfer-Encoding: gzip\r\nContent-Length: 2\r\n\r\n{}", 501, "transfer_encoding_not_implemented",
         "transfer coding 'gzip' is not implemented"),
    ],
    ids=["extra-words", "http-0.9", "space-in-path", "not-http", "unknown-method", "lowercase-method", "bad-version",
         "http-2", "header-without-colon", "space-before-colon", "folded-header", "negative-length", "float-length",
         "list-length", "duplicate-length", "get-bad-length", "chunked", "chunked-and-length", "gzip-coding"],
)  # fmt: skip
def test_malformed_http_is_refused_with_a_status_and_the_reason(server: InferenceServer, request_bytes: bytes, status: int,
                                                                kind: str, fragment: str) -> None:  # fmt: skip
    with AgentApi(server, "127.0.0.1:0") as api:
        got, payload, closed = exchange(api, request_bytes)
        assert (got, payload["error"]) == (status, kind) and fragment in payload["message"], payload
        assert payload["hint"], payload
        assert closed  # the request's framing cannot be trusted: nothing more is read from the connection
        assert AgentClient(api.bound_address).health()["status"] == "ok"


def test_refusals_under_v2_use_the_open_inference_protocols_error_object(server: InferenceServer) -> None:
    with AgentApi(server, "127.0.0.1:0") as api:
        status, payload, closed = exchange(api, b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: localhost\r\n"
                                                b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")  # fmt: skip
        assert (status, closed) == (411, True)
        assert payload == {"error": "chunked transfer encoding (Transfer-Encoding: chunked) is not supported; send the "
                                    "body whole, with a Content-Length header of its size in bytes"}  # fmt: skip
        status, payload, _ = exchange(api, b"DELETE /v2/models/tiny HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert status == 501 and payload["error"].startswith("method 'DELETE' is not implemented; this API answers GET and POST")
        # "\xb2" (latin-1 "²") is a digit to str.isdigit() that int() refuses: a 400, not a 500
        host, port = api.bound_address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /v2/models/tiny-linear-x86-64-cpu-fp32/infer HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n"
                         b"Inference-Header-Content-Length: \xb2\r\n\r\n{}")  # fmt: skip
            status, payload = reply(sock)
        assert status == 400 and payload["error"].startswith("Inference-Header-Content-Length '²' must be an integer"), payload


def test_well_formed_edge_cases_are_served(server: InferenceServer) -> None:
    with AgentApi(server, "127.0.0.1:0") as api, connect(api) as sock:
        # empty lines before a request line are skipped (RFC 9112 2.2); HTTP/1.0 is answered
        sock.sendall(b"\r\n\r\n" + GET_HEALTH + b"\r\n")
        status, payload = reply(sock)
        assert (status, payload["status"]) == (200, "ok")
        sock.sendall(b"GET /v1/health HTTP/1.0\r\n\r\n")
        assert reply(sock)[0] == 200
    with AgentApi(server, "127.0.0.1:0") as api, connect(api) as sock:
        # a GET's body is never read, so its connection is closed after the reply rather than reading the body as
        # the next request
        sock.sendall(GET_HEALTH + b"Content-Length: 40\r\n\r\nGET /v1/stats HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert reply(sock)[0] == 200 and sock.recv(1) == b""


def test_a_binary_header_with_an_absurd_shape_answers_400(server: InferenceServer) -> None:
    header = json.dumps({"tensors": [{"name": "image", "dtype": "float32", "shape": [0, 10**30], "offset": 0, "nbytes": 0}]}).encode()
    header += b" " * (-(8 + len(header)) % 8)
    with AgentApi(server, "127.0.0.1:0") as api:
        status, payload, _ = post(api, struct.pack("<4sI", b"EKT1", len(header)) + header, BINARY_CONTENT_TYPE)
        assert status == 400 and payload["error"] == "input_signature", payload


def test_non_finite_outputs_are_valid_json_and_round_trip(server: InferenceServer) -> None:
    x = np.zeros((2, 1, 8, 8), np.float32)
    x[0, 0, 0, 0], x[1, 0, 0, 0] = np.nan, np.inf
    with AgentApi(server, "127.0.0.1:0") as api:
        status, payload, headers = post(api, encode_binary({"image": x}), BINARY_CONTENT_TYPE, accept="application/json")
        assert status == 200
        data = payload["outputs"]["logits"]["data"]
        assert {value for row in data for value in row} <= {"NaN", "Infinity", "-Infinity"} | {v for row in data for v in row if isinstance(v, float)}
        assert int(headers["X-Edgekit-Non-Finite"]) == sum(isinstance(v, str) for row in data for v in row) > 0
        binary = AgentClient(api.bound_address).infer({"image": x})["logits"]
        via_json = AgentClient(api.bound_address).infer({"image": x}, encoding="json")["logits"]
        np.testing.assert_array_equal(via_json, binary)  # NaN == NaN and the signs of infinities kept
        assert not np.isfinite(binary).all()


def wait_until(condition, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_new_connection_that_sends_nothing_is_closed_after_the_header_timeout(server: InferenceServer) -> None:
    with AgentApi(server, "127.0.0.1:0", header_timeout_s=0.5, idle_timeout_s=60, max_connections=2) as api:
        silent = [connect(api), connect(api)]
        started = time.monotonic()
        for sock in silent:
            status, payload = reply(sock)
            assert status == 408 and payload["error"] == "too_slow"
        assert wait_until(lambda: api.open_connections == 0)
        assert time.monotonic() - started < 3  # not the 60 s idle timeout: the slots are free again
        assert AgentClient(api.bound_address).health()["status"] == "ok"
        for sock in silent:
            sock.close()


def test_limits_hold_on_a_unix_socket(server: InferenceServer, tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    with AgentApi(server, f"unix:{path}", header_timeout_s=0.5, max_connections=1) as api:
        first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        first.connect(str(path))
        first.sendall(b"GET /v1/health HTTP/1.1\r\n")  # and never the rest
        assert wait_until(lambda: api.open_connections == 1)
        second = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        second.settimeout(10)
        second.connect(str(path))
        assert reply(second)[0] == 503
        first.settimeout(10)
        status, payload = reply(first)
        assert status == 408 and "headers did not arrive in time" in payload["message"]
        for sock in (first, second):
            sock.close()
        assert wait_until(lambda: api.open_connections == 0)
        assert AgentClient(api.bound_address).health()["status"] == "ok"
