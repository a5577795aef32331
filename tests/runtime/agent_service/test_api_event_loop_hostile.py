"""Broken and hostile clients on connections the local API's event loop serves (``agent/http_loop.py``): pipelined
requests, idle connections, bodies cut off by a disconnect, one bad request among concurrent good ones, and a client
that keeps sending without ever reading its replies.
Each connection is moved onto the loop first (one good kept-alive inference request), as a real client's is."""

from __future__ import annotations

import gzip
import http.client
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.runtime.agent_service.model_bundles import serving_models
from tests.runtime.agent_service.test_api_event_loop import MODEL, binary_logits, binary_request, images, logits_of, raw_request, wait_for
from tests.runtime.tiny_bundle import reference_logits

IDLE_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 2.0


@pytest.fixture
def agent(agent_config: Callable[..., Path], tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Iterator[Any]:
    api = {"address": "127.0.0.1:0", "idle_timeout_s": IDLE_TIMEOUT_S, "body_timeout_s": BODY_TIMEOUT_S}
    with serving_models(agent_config, tmp_path, fleet_keys[0], [MODEL], batching={"max_delay_ms": 0.5}, api=api) as service:
        yield service


@pytest.fixture
def patient_agent(agent_config: Callable[..., Path], tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Iterator[Any]:
    """An agent that waits long for a reply to be taken (the default ``body_timeout_s``)."""
    api = {"address": "127.0.0.1:0", "body_timeout_s": 60}
    with serving_models(agent_config, tmp_path, fleet_keys[0], [MODEL], batching={"max_delay_ms": 0.5}, api=api) as service:
        yield service


def on_the_loop(agent: Any) -> socket.socket:
    """A connection the loop serves: one good request answered on it, and the loop counting it."""
    host, port = agent.api_address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    array = images(1, 99)
    sock.sendall(raw_request(array))
    np.testing.assert_allclose(read_logits(sock), reference_logits(array), rtol=1e-4, atol=1e-5)
    assert wait_for(lambda: agent.api.loop_connections >= 1)
    return sock


def read_logits(sock: socket.socket) -> np.ndarray:
    reply = http.client.HTTPResponse(sock)
    reply.begin()
    return logits_of(reply)


def test_two_requests_pipelined_in_one_send_are_both_answered_in_order(agent: Any) -> None:
    with on_the_loop(agent) as sock, sock.makefile("rb") as stream:
        first, second = images(1, 1), images(3, 2)
        sock.sendall(raw_request(first) + raw_request(second))
        for expected in (first, second):  # one buffered reader: both replies may come in one segment
            status, headers, body = read_reply(stream)
            assert status == 200, body
            got = binary_logits(body, int(headers["inference-header-content-length"]))
            np.testing.assert_allclose(got, reference_logits(expected), rtol=1e-4, atol=1e-5)


def read_reply(stream: Any) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 reply off ``stream`` (status, headers by lower-case name, body by its Content-Length), leaving
    what follows it in the stream."""
    status = int(stream.readline().split(b" ", 2)[1])
    headers: dict[str, str] = {}
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, stream.read(int(headers["content-length"]))


def test_a_loop_connection_idle_past_the_idle_timeout_is_closed(agent: Any) -> None:
    with on_the_loop(agent) as sock:
        sock.settimeout(IDLE_TIMEOUT_S + 5)
        assert sock.recv(1) == b"", "the agent should close an idle connection, sending nothing"
        assert wait_for(lambda: agent.api.loop_connections == 0)


def test_a_client_gone_halfway_through_its_body_leaves_no_bytes_reserved(agent: Any) -> None:
    budget = agent.api.body_budget
    with on_the_loop(agent) as sock:
        request = raw_request(images(16, 5))
        sock.sendall(request[: len(request) // 2])
        assert wait_for(lambda: budget.reserved_bytes > 0), "the head was read, so its body's bytes are reserved"
    assert wait_for(lambda: budget.reserved_bytes == 0 and agent.api.loop_connections == 0), budget.reserved_bytes
    with on_the_loop(agent) as sock:  # and the API serves the next client as before
        array = images(2, 6)
        sock.sendall(raw_request(array))
        np.testing.assert_allclose(read_logits(sock), reference_logits(array), rtol=1e-4, atol=1e-5)
    assert wait_for(lambda: budget.reserved_bytes == 0)


def test_one_wrong_shape_among_concurrent_requests_fails_alone(agent: Any) -> None:
    clients, rounds = 6, 20
    outcomes: dict[int, list[Any]] = {index: [] for index in range(clients)}
    start = threading.Barrier(clients)

    def client(index: int) -> None:
        with on_the_loop(agent) as sock:
            start.wait()
            for step in range(rounds):
                if index == 0:  # a 4x4 image: the right byte count for its header, the wrong shape for the model
                    bad = np.zeros((1, 1, 4, 4), np.float32)
                    sock.sendall(raw_request(bad))
                    reply = http.client.HTTPResponse(sock)
                    reply.begin()
                    outcomes[index].append((reply.status, json.loads(reply.read())))
                    continue
                array = images(1, index * 100 + step)
                sock.sendall(raw_request(array))
                outcomes[index].append(np.allclose(read_logits(sock), reference_logits(array), rtol=1e-4, atol=1e-5))

    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert all(len(outcomes[index]) == rounds for index in range(clients)), {k: len(v) for k, v in outcomes.items()}
    for status, body in outcomes[0]:
        assert status == 400 and "image" in body["error"], (status, body)
    assert all(all(outcomes[index]) for index in range(1, clients)), "a good request got a wrong answer"


def send_without_reading(sock: socket.socket, request: bytes) -> tuple[int, bool]:
    """Send ``request`` over and over on ``sock`` (its receive buffer shrunk, so that replies back up at once) and
    read nothing, until nothing more goes out for half a second (the agent holds the client back), 256 MiB went
    (far past what the kernel buffers on loopback hold) or 10 s passed: (bytes sent, held back). A partial send is
    carried on from where it stopped, so each request arrives whole."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    sent, limit, deadline = 0, 256 * 2**20, time.monotonic() + 10
    while sent < limit and time.monotonic() < deadline:
        try:
            sent += sock.send(memoryview(request)[sent % len(request) :])
        except BlockingIOError:
            if not select.select([], [sock], [], 0.5)[1]:
                return sent, True
    return sent, False


def test_a_client_that_never_reads_its_replies_is_held_back_then_closed_and_others_are_served(agent: Any) -> None:
    """Requests pipelined without end by a client that reads nothing: the agent stops reading that connection
    while its reply waits (the client's sends block: what the agent holds stays bounded), serves another client
    meanwhile, and closes the stalled one once its reply has waited ``body_timeout_s``."""
    with on_the_loop(agent) as greedy:
        sent, held_back = send_without_reading(greedy, raw_request(images(16, 7)))
        assert held_back, f"the agent went on reading a client that takes no replies ({sent / 2**20:.0f} MiB sent)"
        held = agent.api.loop_held_bytes  # the rest of what was sent waits in the kernel's socket buffers
        assert held <= 2 * 2**20, f"the agent holds {held / 2**20:.1f} MiB of a client that takes no replies"

        with on_the_loop(agent) as other:  # a well-behaved client is served meanwhile, on the same loop
            array = images(2, 8)
            other.sendall(raw_request(array))
            np.testing.assert_allclose(read_logits(other), reference_logits(array), rtol=1e-4, atol=1e-5)

        greedy.setblocking(True)
        greedy.settimeout(BODY_TIMEOUT_S + 10)
        assert wait_for(lambda: agent.api.loop_connections == 0, BODY_TIMEOUT_S + 5), "the stalled connection stayed open"
        assert agent.api.body_budget.reserved_bytes == 0


def test_a_client_that_never_reads_its_replies_on_a_thread_is_held_back_then_closed(agent: Any) -> None:
    """The same on a connection a thread serves (requests other than inference stay on threads): the thread reads
    the next request only once its reply has left, so TCP holds the client back, and the connection is cut when a
    reply cannot leave in time (its send's socket timeout, ``idle_timeout_s``, or ``body_timeout_s``, whichever
    comes first); the agent stays healthy for other clients."""
    host, port = agent.api_address.rsplit(":", 1)
    request = f"GET /v2/models/{MODEL} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    open_before = agent.api.open_connections
    with socket.create_connection((host, int(port)), timeout=30) as greedy:
        sent, held_back = send_without_reading(greedy, request)
        assert held_back, f"the agent went on reading a client that takes no replies ({sent / 2**20:.0f} MiB sent)"
        with on_the_loop(agent) as other:
            array = images(1, 9)
            other.sendall(raw_request(array))
            np.testing.assert_allclose(read_logits(other), reference_logits(array), rtol=1e-4, atol=1e-5)
        greedy.setblocking(True)
        greedy.settimeout(1)
        assert wait_for(lambda: agent.api.open_connections <= open_before, BODY_TIMEOUT_S + 10), agent.api.open_connections


def test_a_slow_reader_gets_every_pipelined_request_answered_in_order_once_it_reads(patient_agent: Any) -> None:
    """The same client, held back, starts reading before ``body_timeout_s``: nothing it sent is lost or reordered
    (requests read before a reply got stuck are served by the loop once it has left, the rest as they come)."""
    with on_the_loop(patient_agent) as slow, slow.makefile("rb") as stream:
        slow.setblocking(False)  # its receive buffer left as it is: one shrunk below an MSS stalls loopback TCP itself
        arrays = [images(4, seed) for seed in range(8)]
        requests = [raw_request(array) for array in arrays]
        sent, count = 0, 0  # bytes of the current request sent, requests begun
        while True:
            request = requests[count % len(requests)]
            try:
                sent += slow.send(memoryview(request)[sent:])
            except BlockingIOError:
                if not select.select([], [slow], [], 0.5)[1]:
                    break  # held back
                continue
            if sent == len(request):
                sent, count = 0, count + 1
        answers: list[Any] = []

        def read_all(expected: int) -> None:
            for _ in range(expected):
                status, headers, body = read_reply(stream)
                answers.append((status, binary_logits(body, int(headers["inference-header-content-length"]))))

        slow.settimeout(30)
        expected = count + (1 if sent else 0)
        reader = threading.Thread(target=read_all, args=(expected,))
        reader.start()
        if sent:  # finish the request cut off mid-way, while the replies are read
            rest = memoryview(requests[count % len(requests)])[sent:]
            threading.Thread(target=lambda: slow.sendall(rest), daemon=True).start()
        reader.join(timeout=60)
        assert len(answers) == expected > 100, (len(answers), expected)
        for index, (status, logits) in enumerate(answers):
            assert status == 200
            np.testing.assert_allclose(logits, reference_logits(arrays[index % len(arrays)]), rtol=1e-4, atol=1e-5)


def test_requests_pipelined_behind_one_a_thread_serves_are_all_answered_in_order(agent: Any) -> None:
    """A gzip body goes to a thread (the loop serves plain requests only) with every byte the loop had read, here
    the ten requests pipelined behind it too (far more than the thread's read buffer); the thread answers it and
    moves the connection back to the loop with all of what it holds, so none is lost."""
    with on_the_loop(agent) as sock, sock.makefile("rb") as stream:
        first = images(2, 40)
        body, headers = binary_request(first)
        packed = gzip.compress(body)
        head = {**headers, "Content-Encoding": "gzip", "Content-Length": str(len(packed)), "Host": "127.0.0.1"}
        gzipped = f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\n".encode() + "".join(f"{k}: {v}\r\n" for k, v in head.items()).encode() + b"\r\n" + packed
        behind = [images(16, 41 + index) for index in range(10)]
        sock.sendall(gzipped + b"".join(raw_request(array) for array in behind))
        for expected in (first, *behind):
            status, reply_headers, reply = read_reply(stream)
            assert status == 200, reply
            got = binary_logits(reply, int(reply_headers["inference-header-content-length"]))
            np.testing.assert_allclose(got, reference_logits(expected), rtol=1e-4, atol=1e-5)
