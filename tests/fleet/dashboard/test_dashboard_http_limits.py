"""The dashboard's HTTP server against slow, greedy and hostile clients, over raw sockets to a real
``DashboardServer`` on a real SQLite store: half-open and slow connections closed with 408 within a few
seconds, a connection cap and a per-client share answered with 503 (a flood of 1,100 connections leaves
it serving), 400 for a bad Content-Length, 421 for a rebound Host, 403 for a foreign Origin, 415 for a
simple-request POST."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgekit.fleet.dashboard import DashboardServer


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[DashboardServer]:
    from edgekit.fleet.store import open_store

    url = f"sqlite:///{tmp_path}/fleet.db"
    with open_store(url):
        pass
    server = DashboardServer(url, port=0, cache_s=0.0)
    server.http.header_timeout_s, server.http.body_timeout_s = 1.5, 1.5
    server.http.allow_hosts(["fleet.lab.example"])
    with server:
        yield server


def connect(server: DashboardServer, source: str | None = None) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.http.port), timeout=10, source_address=(source, 0) if source else None)


def read_reply(sock: socket.socket) -> tuple[int, dict]:
    response = http.client.HTTPResponse(sock)
    response.begin()
    assert response.getheader("Content-Type") == "application/json", response.getheaders()
    return response.status, json.loads(response.read())


def exchange(server: DashboardServer, request: bytes, source: str | None = None) -> tuple[int, dict]:
    with connect(server, source) as sock:
        sock.sendall(request)
        return read_reply(sock)


def closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def answered_408_then_closed(sock: socket.socket) -> bool:
    sock.settimeout(5)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data.startswith(b"HTTP/1.1 408 Request Timeout\r\n")


def _wait(condition, timeout_s: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_half_open_and_slow_connections_are_closed_with_408(dashboard: DashboardServer) -> None:
    dashboard.http.max_connections_per_client = 128
    started = time.monotonic()
    silent = [connect(dashboard) for _ in range(100)]  # connect and say nothing
    slow = connect(dashboard)
    slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")  # headers never finished
    body = connect(dashboard)
    body.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{")  # body never finished
    status, payload = read_reply(silent[0])
    assert status == 408 and payload["error"] == "no request arrived within 1.5 s of connecting; send it at once"
    status, payload = read_reply(slow)
    assert status == 408 and payload["error"] == "the request line and headers did not arrive within 1.5 s; send them at once"
    status, payload = read_reply(body)
    assert status == 408 and payload["error"] == "the request body did not arrive within 1.5 s"
    assert all(closed_by_server(sock) for sock in [slow, body, silent[0]])
    assert all(answered_408_then_closed(sock) for sock in silent[1:])
    assert time.monotonic() - started < 6
    assert _wait(lambda: dashboard.http.open_connections == 0)
    for sock in [slow, body, *silent]:
        sock.close()


@pytest.mark.parametrize(("length", "message"), [
    (b"abc", "Content-Length 'abc' is not a non-negative decimal number of bytes"),
    (b"-1", "Content-Length '-1' is not a non-negative decimal number of bytes"),
    (b"5\r\nContent-Length: 7", "2 Content-Length headers; send one"),
])  # fmt: skip
def test_a_bad_content_length_is_a_400_not_a_traceback(dashboard: DashboardServer, length: bytes, message: str,
                                                        caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    with caplog.at_level(logging.DEBUG):
        status, payload = exchange(dashboard, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nContent-Length: " + length + b"\r\n\r\n")
        assert (status, payload) == (400, {"error": message, "status": 400})
        assert exchange(dashboard, b"GET /api/overview HTTP/1.1\r\nHost: localhost\r\n\r\n")[0] == 200  # still serving
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text


def test_the_connection_cap_answers_503_and_a_flood_leaves_it_serving(dashboard: DashboardServer) -> None:
    http_server = dashboard.http
    http_server.max_connections, http_server.max_connections_per_client = 200, 200
    http_server.header_timeout_s = 30.0  # the flood's connections stay open while it runs
    flood = []
    for _ in range(1100):  # the reviewer's flood ran the old server out of file handles at about 1,100
        flood.append(connect(dashboard))
    assert _wait(lambda: http_server.open_connections == 200)
    status, payload = read_reply(flood[-1])
    assert status == 503
    assert payload["error"] == "the dashboard already serves 200 connections, its limit; try again shortly"
    assert http_server.refused_connections >= 900
    for sock in flood:
        sock.close()
    assert _wait(lambda: http_server.open_connections == 0)
    assert exchange(dashboard, b"GET /api/overview HTTP/1.1\r\nHost: localhost\r\n\r\n")[0] == 200


def test_one_client_address_cannot_hold_every_slot(dashboard: DashboardServer) -> None:
    http_server = dashboard.http
    http_server.max_connections, http_server.max_connections_per_client = 12, 4
    hog = [connect(dashboard, "127.0.0.2") for _ in range(4)]
    assert _wait(lambda: http_server.open_connections == 4)
    status, payload = exchange(dashboard, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n", source="127.0.0.2")
    assert status == 503
    assert payload["error"] == ("this client (127.0.0.2) already holds 4 connections, its share of 12; "
                                "reuse them (keep-alive) or close some")  # fmt: skip
    with connect(dashboard) as other:  # another address is served meanwhile
        other.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        response = http.client.HTTPResponse(other)
        response.begin()
        assert response.status == 200 and response.read() == b"ok\n"
    for sock in hog:
        sock.close()


def test_rebound_hosts_foreign_origins_and_simple_posts_are_refused(dashboard: DashboardServer) -> None:
    port = dashboard.http.port
    status, payload = exchange(dashboard, b"GET /api/overview HTTP/1.1\r\nHost: rebind.attacker.example:%d\r\n\r\n" % port)
    assert status == 421 and payload["error"].startswith(f"Host 'rebind.attacker.example:{port}' is not a name this server answers to")
    assert "add the name to --allow-host" in payload["error"]
    for host in (b"127.0.0.1:%d" % port, b"localhost:%d" % port, b"fleet.lab.example:%d" % port, b"[::1]:%d" % port):
        assert exchange(dashboard, b"GET /api/overview HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")[0] == 200, host
    status, payload = exchange(dashboard, b"GET /api/overview HTTP/1.1\r\nHost: localhost\r\nOrigin: https://ads.example.com\r\n\r\n")
    assert status == 403 and payload["error"].startswith("requests from web pages at 'https://ads.example.com' are refused")
    status, payload = exchange(dashboard, b"GET /api/overview HTTP/1.1\r\nHost: localhost\r\nOrigin: http://localhost:%d\r\n\r\n" % port)
    assert status == 200
    status, payload = exchange(dashboard, b"POST /api/overview HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\n"
                                          b"Content-Length: 2\r\n\r\n{}")  # fmt: skip
    assert status == 415 and payload["error"].startswith("Content-Type 'text/plain' is not accepted (a type any web page may send")


def _read_answer(sock: socket.socket) -> bytes:
    """One whole answer (head and its Content-Length of body); its head is returned."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        body += sock.recv(65536)
    return head


@pytest.mark.parametrize(("request_head", "kept"), [
    (b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", False),  # HTTP/1.0 closes unless asked to keep alive
    (b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: Keep-Alive\r\n\r\n", True),
    (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", True),  # HTTP/1.1 keeps alive unless asked to close
    (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive, close\r\n\r\n", False),
])  # fmt: skip
def test_connections_stay_open_only_as_the_http_version_and_connection_header_say(
        dashboard: DashboardServer, request_head: bytes, kept: bool) -> None:  # fmt: skip
    dashboard.http.idle_timeout_s = 12.0  # a kept connection outlives the check below
    with connect(dashboard) as sock:
        sock.sendall(request_head)
        head = _read_answer(sock)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and (b"Connection: keep-alive" if kept else b"Connection: close") in head, head
        sock.settimeout(3.0)
        try:
            closed = sock.recv(1) == b""
        except ConnectionResetError:
            closed = True
        except TimeoutError:
            closed = False
        assert closed is not kept
