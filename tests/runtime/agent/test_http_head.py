"""The agent's plain HTTP/1.1 head parser agrees with the standard library's ``parse_request`` on what it takes,
leaves the rest to it, and a reply on a connection the agent will close says ``Connection: close``."""

from __future__ import annotations

import io
import socket
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from edgekit_runtime.agent.api import AgentApi
from edgekit_runtime.agent.http_head import parse_plain_head


class Head:
    """Attributes ``parse_plain_head`` and ``parse_request`` set, on a bare object."""

    close_connection = True
    protocol_version = "HTTP/1.1"


def stdlib(lines: list[bytes]) -> Any:
    handler = BaseHTTPRequestHandler.__new__(BaseHTTPRequestHandler)
    handler.raw_requestline, handler.rfile = lines[0], io.BytesIO(b"".join(lines[1:]))
    handler.close_connection, handler.request_version, handler.command = True, "HTTP/0.9", None
    handler.protocol_version = "HTTP/1.1"  # as the agent's handler
    assert handler.parse_request()
    return handler


HEADS = [
    [b"POST /v2/models/digits/infer HTTP/1.1\r\n", b"Host: 127.0.0.1:8470\r\n", b"Content-Length: 290\r\n",
     b"Content-Type: application/octet-stream\r\n", b"Inference-Header-Content-Length: 34\r\n", b"\r\n"],
    [b"GET //v2/health/ready HTTP/1.1\r\n", b"host:  x  \r\n", b"Connection: Close\r\n", b"\r\n"],
    [b"GET /v1/stats?x=1 HTTP/1.1\n", b"Accept: a\n", b"accept:\tb\n", b"X-Empty:\n", b"\n"],
    [b"POST /v1/infer HTTP/1.1\r\n", b"Connection: keep-alive\r\n", b"X-Latin: caf\xe9\r\n", b"\r\n"],
]


@pytest.mark.parametrize("lines", HEADS, ids=range(len(HEADS)))
def test_plain_heads_parse_as_the_standard_library_does(lines: list[bytes]) -> None:
    head, reference = Head(), stdlib(lines)
    assert parse_plain_head(head, lines)
    assert (head.command, head.path, head.request_version, head.requestline, head.close_connection) == \
        (reference.command, reference.path, reference.request_version, reference.requestline, reference.close_connection)  # fmt: skip
    assert head.headers.items() == reference.headers.items()
    for name in ("host", "HOST", "Accept", "Content-Length", "connection", "X-Empty", "missing"):
        assert head.headers.get(name) == reference.headers.get(name)
        assert head.headers.get_all(name) == reference.headers.get_all(name)
        assert (name in head.headers) == (name in reference.headers)


@pytest.mark.parametrize("lines", [
    [b"GET / HTTP/1.0\r\n", b"\r\n"],                                    # 1.0: keep-alive rules differ
    [b"POST /v1/infer HTTP/1.1\r\n", b"Expect: 100-continue\r\n", b"\r\n"],  # the standard library answers it
    [b"GET / HTTP/1.1\r\n", *[b"X-A: 1\r\n"] * 101, b"\r\n"],             # over http.client's 100 headers: 431
])  # fmt: skip
def test_other_heads_go_to_the_standard_library(lines: list[bytes]) -> None:
    head = Head()
    assert not parse_plain_head(head, lines) and not hasattr(head, "headers")


def test_a_reply_before_an_unread_body_says_connection_close(server: Any) -> None:
    """The agent closes a connection whose request body it did not read; the reply must say so, else a
    keep-alive client sends its next request into the closed socket (a flaky 'connection closed')."""
    with AgentApi(server, "127.0.0.1:0") as api:
        host, port = api.bound_address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /v2/models/nope/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 5\r\n\r\n")  # fmt: skip
            reply = b""
            while b"\r\n\r\n" not in reply:
                reply += sock.recv(4096)
    head = reply.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
    assert head.startswith("http/1.1 404") and "\r\nconnection: close" in head
