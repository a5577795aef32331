"""A request's life on the local API's thread path, as a review of the last fixes found it: a POST with no body
(an OIP repository load) is serving from its head on (never evicted while it runs), ``100 Continue`` belongs to
the request that asked for it only, and an agent-side OSError is a 500 logged as an error (only the client's own
connection errors are taken for it going away). Real AgentApi servers on loopback."""

from __future__ import annotations

import http.client
import logging
import socket
import time
from typing import Any

import pytest

from edgekit_runtime.agent.api import AgentApi


class _Slot:
    name, version, ready = "m", None, True

    def __init__(self, calls: list[float]) -> None:
        self.calls = calls

    def load(self) -> None:
        self.calls.append(time.monotonic())
        time.sleep(2.5)  # a load verifies the bundle again: seconds on a device


class _Models:
    default = None

    def __init__(self) -> None:
        self.calls: list[float] = []

    def find(self, name: str) -> Any:
        return _Slot(self.calls) if name == "m" else None

    def slots(self) -> list[Any]:
        return [_Slot(self.calls)]


def _address(api: AgentApi) -> tuple[str, int]:
    host, port = api.bound_address.rsplit(":", 1)
    return host, int(port)


def _reply(sock: socket.socket) -> bytes:
    out = b""
    while b"\r\n\r\n" not in out:
        chunk = sock.recv(65536)
        if not chunk:
            break
        out += chunk
    return out


def test_a_post_without_a_body_is_not_evicted_while_it_runs() -> None:
    models = _Models()
    with AgentApi(models, "127.0.0.1:0", max_connections=2, event_loop=False) as api:
        with socket.create_connection(_address(api), timeout=10) as loading:
            loading.sendall(b"POST /v2/repository/models/m/load HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n")
            time.sleep(1.5)  # past the grace after which a connection without a whole request may be evicted
            others = [socket.create_connection(_address(api), timeout=10) for _ in range(2)]
            try:
                reply = _reply(loading)
            finally:
                for sock in others:
                    sock.close()
        assert reply.startswith(b"HTTP/1.1 200 ") and api.evicted_connections == 0  # before: 503 evicted, the load ran
        assert len(models.calls) == 1


def _status_and_skip_reply(stream: Any) -> bytes:
    """The first status line on ``stream``, the rest of that reply (headers, Content-Length bytes) read past."""
    status = stream.readline()
    length = 0
    while (line := stream.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    stream.read(length)
    return status


def test_100_continue_is_sent_only_for_the_request_that_asked() -> None:
    with AgentApi(_Models(), "127.0.0.1:0", event_loop=False) as api, socket.create_connection(_address(api), timeout=10) as sock, \
            sock.makefile("rb") as stream:  # fmt: skip
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n\r\n")
        first = _status_and_skip_reply(stream)
        sock.sendall(b"POST /v2/repository/index HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 2\r\n\r\n{}")  # fmt: skip
        second = _status_and_skip_reply(stream)
    assert not first.startswith(b"HTTP/1.1 100") and second.startswith(b"HTTP/1.1 200")  # before: the GET's 100 came here


def test_an_oserror_inside_the_agent_is_a_logged_500_not_a_dropped_connection(caplog: pytest.LogCaptureFixture) -> None:
    def health() -> dict[str, Any]:
        open("/nonexistent/spool/state.json")  # noqa: SIM115 - the agent-side fault under test
        return {}

    with caplog.at_level(logging.ERROR, logger="edgekit_runtime"), \
            AgentApi(_Models(), "127.0.0.1:0", health_provider=health, event_loop=False) as api:  # fmt: skip
        connection = http.client.HTTPConnection(*_address(api), timeout=5)
        connection.request("GET", "/v1/health")
        reply = connection.getresponse()
        assert reply.status == 500 and b'"internal"' in reply.read()  # before: RemoteDisconnected, logged at DEBUG
        connection.close()
    assert "FileNotFoundError" in caplog.text or "No such file" in caplog.text
