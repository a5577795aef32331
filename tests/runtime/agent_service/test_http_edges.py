"""HTTP details a review found wrong, against the real agent: ``Expect: 100-continue`` answered at once, a
bare LF in a header line read the same on the event loop as on the threads, Content-Length with optional
whitespace, gzip bodies of several members (and junk after one; many tiny members decoded in linear work, too
many refused), a request pipelined after one the event loop refused, and the readiness of a version the model
does not serve (400 ``ready: false``, as docs/oip-compliance.md says)."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import time
import types
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit_runtime.agent import http_handler
from tests.runtime.agent_service.model_bundles import serving_models
from tests.runtime.agent_service.test_api_event_loop import MODEL, binary_request, images, raw_request
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


class _CountingZlib:
    """Stands in for :mod:`zlib` in the handler: counts the bytes handed to its decoders (what zlib copies and
    scans), and fails the request once they pass ``bound`` (the old decoder's quadratic work stops there)."""

    error, MAX_WBITS = zlib.error, zlib.MAX_WBITS

    def __init__(self, bound: int) -> None:
        self.bound, self.fed, self.decoders = bound, 0, 0

    def decompressobj(self, wbits: int) -> Any:
        self.decoders += 1
        decoder, counter = zlib.decompressobj(wbits), self

        class Counted:
            def decompress(self, data: Any, max_length: int = 0) -> bytes:
                counter.fed += len(data)
                if counter.fed > counter.bound:
                    raise RuntimeError(f"{counter.fed} bytes fed to decoders, over {counter.bound}")
                return decoder.decompress(data, max_length)

            def __getattr__(self, name: str) -> Any:
                return getattr(decoder, name)

        return Counted()


def test_a_gzip_body_of_many_tiny_members_is_decoded_in_work_linear_in_its_size(agent: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    body = _json_body(images(1, 7))
    pieces = [body[i : i + 4] for i in range(0, len(body), 4)]
    members = b"".join(gzip.compress(piece) + gzip.compress(b"") for piece in pieces)
    count = 2 * len(pieces)
    assert 600 < count <= 1024  # under the cap on members
    counting = _CountingZlib(bound=64 * len(members))
    monkeypatch.setattr(http_handler, "zlib", counting)
    status, reply = _post(agent, members, {"Content-Encoding": "gzip"})
    assert status == 200, reply  # before: 500, the rest of the body handed to a decoder again after each member
    np.testing.assert_allclose(json.loads(reply)["outputs"][0]["data"], reference_logits(images(1, 7)).reshape(-1), rtol=1e-4, atol=1e-5)
    assert counting.decoders == count and counting.fed <= 64 * len(members)


def test_a_gzip_body_of_more_members_than_the_cap_is_refused_without_decoding_them_all(agent: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    members = gzip.compress(b"") * 5000  # 100 KB of empty members: before, ~250 MB handed to 5,000 decoders
    counting = _CountingZlib(bound=64 * len(members))
    monkeypatch.setattr(http_handler, "zlib", counting)
    status, reply = _post(agent, members, {"Content-Encoding": "gzip"})
    assert status == 400 and b"the gzip body has more than 1024 members" in reply, reply  # before: 500
    assert counting.decoders == 1024 and counting.fed <= 64 * len(members)


def test_a_request_pipelined_after_one_the_loop_refuses_is_answered_on_the_loop(agent: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The refused request is answered while it is parsed; the next one, already in the buffer, used to wait for the
    loop's reaper (up to 250 ms) and go to a thread. Now the loop parses it at once and serves it itself."""
    handed_back: list[Any] = []
    httpd = agent.api._httpd
    serve_on_thread = httpd.serve_on_thread
    monkeypatch.setattr(httpd, "serve_on_thread", lambda *args: (handed_back.append(args), serve_on_thread(*args)))
    good = images(1, 8)
    bad = raw_request(images(1, 9)).replace(b'"binary_data_size": 256', b'"binary_data_size": 252')  # same length
    assert b'"binary_data_size": 252' in bad
    with on_the_loop(agent) as sock, sock.makefile("rb") as stream:
        for _ in range(3):
            sock.sendall(bad + raw_request(good))
            status, _, reply = read_reply(stream)
            assert status == 400 and b"binary_data_size 252 does not match FP32[1, 1, 8, 8] (256 bytes)" in reply
            status, headers_back, reply = read_reply(stream)
            assert status == 200, reply
            got = np.frombuffer(reply[int(headers_back["inference-header-content-length"]) :], "<f4").reshape(1, 10)
            np.testing.assert_allclose(got, reference_logits(good), rtol=1e-4, atol=1e-5)
    assert handed_back == []  # before: each good request went to a thread after the reaper's tick


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
