"""HTTP details a review found wrong, against the real agent: ``Expect: 100-continue`` answered at once, a
bare LF in a header line read the same on the event loop as on the threads, Content-Length with optional
whitespace, gzip bodies of several members (and junk after one), and the readiness of a version the model does
not serve (400 ``ready: false``, as docs/oip-compliance.md says)."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.runtime.agent_service.model_bundles import serving_models
from tests.runtime.agent_service.test_api_event_loop import MODEL, binary_request, images
from tests.runtime.agent_service.test_api_event_loop_hostile import on_the_loop, read_reply
from tests.runtime.tiny_bundle import reference_logits


@pytest.fixture
def agent(agent_config: Callable[..., Path], tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Iterator[Any]:
    with serving_models(agent_config, tmp_path, fleet_keys[0], [MODEL], batching={"max_delay_ms": 0.5}) as service:
        yield service


def _address(agent: Any) -> tuple[str, int]:
    host, port = agent.api_address.rsplit(":", 1)
    return host, int(port)


def _json_body(array: np.ndarray) -> bytes:
    return json.dumps({"inputs": [{"name": "image", "shape": list(array.shape), "datatype": "FP32",
                                   "data": array.reshape(-1).tolist()}]}).encode()  # fmt: skip


def _post(agent: Any, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(*_address(agent), timeout=30)
    try:
        connection.request("POST", f"/v2/models/{MODEL}/infer", body=body, headers={"Content-Type": "application/json", **headers})
        reply = connection.getresponse()
        return reply.status, reply.read()
    finally:
        connection.close()


def test_expect_100_continue_is_answered_before_the_body_is_sent(agent: Any) -> None:
    body = _json_body(images(1, 3))
    with socket.create_connection(_address(agent), timeout=5) as sock:
        sock.sendall((f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      f"Expect: 100-continue\r\nContent-Length: {len(body)}\r\n\r\n").encode())  # fmt: skip
        sock.settimeout(2.0)
        started = time.monotonic()
        assert sock.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n")  # before: held in the write buffer until the reply
        assert time.monotonic() - started < 1.0
        sock.sendall(body)
        with sock.makefile("rb") as stream:
            status, _, reply = read_reply(stream)
    assert status == 200, reply


def test_a_bare_lf_in_a_header_line_is_read_as_the_threads_read_it(agent: Any) -> None:
    """A hidden ``Transfer-Encoding: chunked`` after a bare LF: the threads see it (411); the loop used to take the
    line for one header and serve the request."""
    body, headers = binary_request(images(1, 4))
    with on_the_loop(agent) as sock, sock.makefile("rb") as stream:
        head = "".join(f"{name}: {value}\r\n" for name, value in {**headers, "Content-Length": str(len(body))}.items())
        sock.sendall(f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nX-Note: a\nTransfer-Encoding: chunked\r\n{head}\r\n".encode() + body)
        status, _, reply = read_reply(stream)
    assert status == 411 and b"chunked transfer encoding" in reply


def test_content_length_with_optional_whitespace_is_read(agent: Any) -> None:
    array = images(1, 5)
    body = _json_body(array)
    with socket.create_connection(_address(agent), timeout=10) as sock, sock.makefile("rb") as stream:
        sock.sendall((f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)} \t\r\n\r\n").encode() + body)  # fmt: skip
        status, _, reply = read_reply(stream)
    assert status == 200, reply  # before: 400 "is not a non-negative decimal number"
    np.testing.assert_allclose(json.loads(reply)["outputs"][0]["data"], reference_logits(array).reshape(-1), rtol=1e-4, atol=1e-5)


def test_gzip_bodies_of_several_members_are_read_whole_and_junk_after_one_is_refused(agent: Any) -> None:
    body = _json_body(images(2, 6))
    half = len(body) // 2
    members = gzip.compress(body[:half]) + gzip.compress(body[half:])  # what `cat a.gz b.gz` gives; gzip.decompress reads it
    status, reply = _post(agent, members, {"Content-Encoding": "gzip"})
    assert status == 200, reply  # before: 400, only the first member decoded
    status, reply = _post(agent, gzip.compress(body) + b"trailing junk!!", {"Content-Encoding": "gzip"})
    assert status == 400 and b"the gzip body has 15 bytes after its end marker" in reply  # before: 200, the junk ignored


def test_readiness_of_a_version_the_model_does_not_serve_is_false_not_unknown(agent: Any) -> None:
    connection = http.client.HTTPConnection(*_address(agent), timeout=10)
    try:
        for version, status in (("1", 200), ("7", 400)):
            connection.request("GET", f"/v2/models/{MODEL}/versions/{version}/ready")
            reply = connection.getresponse()
            assert (reply.status, json.loads(reply.read())) == (status, {"name": MODEL, "ready": status == 200})
        connection.request("GET", "/v2/models/nope/versions/1/ready")
        assert connection.getresponse().status == 404
    finally:
        connection.close()
