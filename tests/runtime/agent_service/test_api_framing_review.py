"""The local API's plumbing, as a review found it wanting, against the real agent: a Content-Length of thousands
of (zero) digits, a HEAD refused without a body, ``Expect: 100-continue`` answered only once the request passed
its checks, connections trickling their body evictable like those stalled in their headers, a client reset that
is no agent error, /v1/health after the model was unloaded, and the AgentClient on an evicted connection or a
garbled reply."""

from __future__ import annotations

import http.client
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit_runtime.agent.client import AgentClient
from edgekit_runtime.agent.errors import AgentApiError
from tests.runtime.agent_service.model_bundles import serving_models


@pytest.fixture
def agent(agent_config: Callable[..., Path], tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Iterator[Any]:
    api = {"address": "127.0.0.1:0", "max_connections": 3, "body_timeout_s": 30}
    with serving_models(agent_config, tmp_path, fleet_keys[0], ["digits"], api=api) as service:
        yield service


def _address(agent: Any) -> tuple[str, int]:
    host, port = agent.api_address.rsplit(":", 1)
    return host, int(port)


def _exchange(agent: Any, data: bytes, wait_s: float = 3.0) -> bytes:
    with socket.create_connection(_address(agent), timeout=wait_s) as sock:
        sock.sendall(data)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except TimeoutError:
            pass
    return out


def test_a_content_length_of_thousands_of_digits_is_a_body_of_its_value_or_too_large(agent: Any) -> None:
    smuggled = b"GET /v1/signature HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    padded = b"0" * 4300 + str(len(smuggled)).encode()  # int() refuses 4,302 digits: before, a 500 and the body read as a request
    out = _exchange(agent, b"POST /v1/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: "
                    + padded + b"\r\n\r\n" + smuggled)  # fmt: skip
    assert out.count(b"HTTP/1.1 ") == 1 and out.startswith(b"HTTP/1.1 400 ")  # the 47 bytes were the body, not JSON
    huge = b"9" * 4400
    out = _exchange(agent, b"POST /v1/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: "
                    + huge + b"\r\n\r\n" + smuggled)  # fmt: skip
    assert out.count(b"HTTP/1.1 ") == 1 and out.startswith(b"HTTP/1.1 413 ") and b"4400 digits" in out


def test_head_is_refused_without_a_body(agent: Any) -> None:
    out = _exchange(agent, b"HEAD /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 501 ") and body == b""  # before: a 123-byte JSON body after the head


def test_expect_100_continue_is_not_sent_for_a_request_that_is_refused(agent: Any) -> None:
    out = _exchange(agent, b"POST /v1/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\nExpect: 100-continue\r\n"
                    b"Content-Length: 5000000\r\n\r\n")  # fmt: skip
    assert out.startswith(b"HTTP/1.1 415 ") and b"100 Continue" not in out  # before: 100, then the refusal


def test_connections_trickling_their_body_are_evicted_like_those_stalled_in_their_headers(agent: Any) -> None:
    head = b"POST /v1/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2000\r\n\r\n{"
    stalled = [socket.create_connection(_address(agent), timeout=5) for _ in range(3)]
    try:
        for sock in stalled:
            sock.sendall(head)
        time.sleep(1.5)  # past the grace after which a connection without a whole request may be evicted
        with AgentClient(agent.api_address) as client:
            assert client.health()["status"] == "ok"  # before: 503 busy for body_timeout_s
        assert agent.api.evicted_connections >= 1
    finally:
        for sock in stalled:
            sock.close()


def test_a_client_reset_mid_body_is_no_agent_error(agent: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="edgekit_runtime"):
        sock = socket.create_connection(_address(agent), timeout=5)
        sock.sendall(b"POST /v1/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 9000\r\n\r\n{")
        time.sleep(0.2)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # close with a reset
        sock.close()
        time.sleep(0.5)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


def test_health_after_the_model_is_unloaded_says_no_model(agent: Any) -> None:
    with AgentClient(agent.api_address) as client:
        assert client.health()["status"] == "ok"
        connection = http.client.HTTPConnection(*_address(agent), timeout=10)
        connection.request("POST", "/v2/repository/models/digits/unload", b"{}", {"Content-Type": "application/json"})
        assert connection.getresponse().status == 200
        connection.close()
        health = client.health()  # before: 200 "ok" while /v1/infer answered 503 no_model
        assert health["status"] == "no_model" and health["model"] is None and health["models"][0]["ready"] is False


def test_the_client_goes_again_on_a_new_connection_when_its_idle_one_was_evicted(agent: Any) -> None:
    with AgentClient(agent.api_address) as client:
        assert client.health()["status"] == "ok"  # its kept-alive connection is idle now
        time.sleep(1.5)
        others = [socket.create_connection(_address(agent)) for _ in range(3)]  # the fourth evicts the idle one
        try:
            assert wait(lambda: agent.api.evicted_connections >= 1)
        finally:
            for sock in others:
                sock.close()
        time.sleep(0.3)
        assert client.health()["status"] == "ok"  # before: the "503 evicted" written on it, taken as the answer
        assert client.infer({"image": np.zeros((1, 1, 8, 8), np.float32)})["logits"].shape == (1, 10)


def wait(predicate: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_garbled_reply_is_an_agent_api_error_and_the_next_call_works() -> None:
    good = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 16\r\n\r\n{"status": "ok"}'
    cut = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{"status":'  # whole, but no JSON
    replies = [b"garbage\r\n\r\n", good, b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"status"', good, cut, good]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def serve() -> None:
        while replies:
            connection, _ = listener.accept()
            with connection:
                while replies and connection.recv(65536):
                    reply = replies.pop(0)
                    connection.sendall(reply)
                    if reply is not good and reply is not cut:
                        break

    threading.Thread(target=serve, daemon=True).start()
    client = AgentClient(f"127.0.0.1:{listener.getsockname()[1]}", timeout_s=3)
    try:
        outcomes = []
        for _ in range(6):
            try:
                outcomes.append(client.health()["status"])
            except AgentApiError as err:  # before: http.client's own exceptions, then CannotSendRequest for good
                outcomes.append("sent no complete HTTP reply" in err.message or "with no health in it" in err.message)
        assert outcomes == [True, "ok", True, "ok", True, "ok"]  # (the fifth: a JSONDecodeError before)
    finally:
        client.close()
        listener.close()
