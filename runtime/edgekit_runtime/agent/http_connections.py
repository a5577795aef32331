"""The local API's connection bookkeeping: the cap, each client's share of it, and the per-phase deadlines.

At ``max_connections`` open connections a new one does not simply get a 503: it takes the slot of the
connection that has waited longest without sending a whole request (headers still arriving, or kept
alive with nothing to do) for at least ``WAITING_GRACE_S``, chosen from the client that holds the most
connections. A client is its address (TCP) or its process (Unix socket, ``SO_PEERCRED``). So 64 slow
connections from one client cannot keep ``/v1/health`` at 503 for others, round after round; a 503
``busy`` is left for a server whose every slot is busy with a request in progress.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import time
from collections import Counter
from http import HTTPStatus
from typing import Any

logger = logging.getLogger("edgekit_runtime.agent.api")

JSON_CONTENT_TYPE = "application/json"
DEFAULT_MAX_CONNECTIONS = 64
#: how often the server closes connections that ran past a deadline
REAP_INTERVAL_S = 0.25
#: a connection waiting this long without a whole request may lose its slot to a new connection
WAITING_GRACE_S = 1.0


def json_canned(status: HTTPStatus, kind: str, message: str, hint: str) -> bytes:
    """A whole HTTP/1.1 error reply, for answers sent outside a handler (busy, too slow)."""
    body = json.dumps({"error": kind, "message": message, "hint": hint}).encode("utf-8")
    head = (f"HTTP/1.1 {status.value} {status.phrase}\r\nContent-Type: {JSON_CONTENT_TYPE}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")  # fmt: skip
    return head.encode("ascii") + body


def client_key(request: socket.socket, client_address: Any) -> str:
    """Who is on the other end: the peer address over TCP, the peer process over a Unix socket."""
    if request.family == socket.AF_UNIX:
        try:
            pid, _uid, _gid = struct.unpack("3i", request.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            return f"pid:{pid}"
        except (OSError, AttributeError, struct.error):
            return "unix"
    return str(client_address[0]) if isinstance(client_address, tuple) else str(client_address)


class ConnectionTracking:
    """Keeps the open connections of a threading server, so that ``close_connections()`` can end the
    kept-alive ones (whose threads would otherwise go on serving after ``shutdown()``); gives a slot past
    ``max_connections`` to a new connection at the expense of the longest-waiting connection of the
    biggest client, else refuses it (503); closes connections that run past their phase's deadline
    (checked from the serving loop, so no thread of its own)."""

    max_connections = DEFAULT_MAX_CONNECTIONS
    #: the listen backlog (socketserver's default of 5 makes a burst of clients wait for SYN retries)
    request_queue_size = 128

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._deadlines: dict[socket.socket, tuple[float, str]] = {}
        self._clients: dict[socket.socket, str] = {}
        #: connections without a whole request in hand -> since when (accepted, or their last reply sent)
        self._waiting: dict[socket.socket, float] = {}
        self._next_reap_s = 0.0
        self.refused_connections = 0
        self.timed_out_connections = 0
        self.evicted_connections = 0
        #: the API's event loop (:mod:`~edgekit_runtime.agent.http_loop`), which kept-alive inference
        #: connections move to; None keeps every connection on its thread
        self.infer_loop: Any = None
        self._to_loop: dict[socket.socket, tuple[Any, bytes]] = {}  # handed over once their thread ends
        self._prefixes: dict[socket.socket, bytes] = {}  # bytes the loop read before handing a connection back
        super().__init__(*args, **kwargs)

    def move_to_loop(self, connection: socket.socket, client_address: Any, leftover: bytes) -> bool:
        """Whether ``connection`` goes to the event loop when its thread ends (with ``leftover``, bytes of its
        next request already read), instead of being closed."""
        loop = self.infer_loop
        if loop is None or not loop.running:
            return False
        self._to_loop[connection] = (client_address, leftover)
        return True

    def serve_on_thread(self, connection: socket.socket, client_address: Any, prefix: bytes) -> None:
        """Serve ``connection`` (back from the event loop) on a thread of its own, reading ``prefix`` first."""
        if prefix:
            self._prefixes[connection] = prefix
        thread = threading.Thread(target=self.process_request_thread, args=(connection, client_address),  # type: ignore[attr-defined]
                                  name="edgekit-api-connection", daemon=True)  # fmt: skip
        thread.start()

    def take_prefix(self, connection: socket.socket) -> bytes:
        return self._prefixes.pop(connection, b"")

    def set_deadline(self, connection: socket.socket, seconds: float, phase: str) -> None:
        """Close ``connection`` unless its ``phase`` (headers, body, reply) ends within ``seconds``."""
        self._deadlines[connection] = (time.monotonic() + seconds, phase)

    def clear_deadline(self, connection: socket.socket) -> None:
        self._deadlines.pop(connection, None)

    def mark_waiting(self, connection: socket.socket) -> None:
        """``connection`` waits for its next request (a new slot may be taken from it after the grace)."""
        self._waiting.setdefault(connection, time.monotonic())

    def mark_serving(self, connection: socket.socket) -> None:
        """``connection``'s request line and headers arrived: its slot is in use."""
        self._waiting.pop(connection, None)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        key = client_key(request, client_address)
        with self._connections_lock:
            self._clients[request] = key
            over = len(self._connections) > self.max_connections
        if not over:
            return True
        victim = self._waiting_victim(exclude=request)
        if victim is not None:
            self._evict(victim)
            return True
        self.refused_connections += 1
        logger.info("API: refused a connection from %s, %d are open and busy (api.max_connections)", key, self.max_connections)
        reply = json_canned(HTTPStatus.SERVICE_UNAVAILABLE, "busy",
                            f"the agent already serves {self.max_connections} connections, its limit, each with a request in progress",
                            "reuse keep-alive connections (AgentClient does), or raise api.max_connections")  # fmt: skip
        try:
            request.setblocking(False)
            for _ in range(16):  # read what already arrived, so that closing sends a FIN and not a reset
                if not request.recv(65536):
                    break
        except OSError:
            pass
        try:
            request.send(reply)
        except OSError:
            pass
        with self._connections_lock:
            self._clients.pop(request, None)
        return False

    def _waiting_victim(self, *, exclude: socket.socket) -> socket.socket | None:
        """The connection that has waited longest (past the grace) of the client holding the most connections."""
        now = time.monotonic()
        with self._connections_lock:
            holdings = Counter(self._clients.get(c, "?") for c in self._connections)
            candidates = [(-holdings[self._clients.get(c, "?")], since, id(c), c) for c, since in list(self._waiting.items())
                          if c is not exclude and c in self._connections and now - since >= WAITING_GRACE_S]  # fmt: skip
        return min(candidates)[3] if candidates else None

    def _evict(self, connection: socket.socket) -> None:
        with self._connections_lock:
            self._connections.discard(connection)
            key = self._clients.pop(connection, "?")
        self._waiting.pop(connection, None)
        self._deadlines.pop(connection, None)
        self.evicted_connections += 1
        logger.info("API: closed a waiting connection of %s to make room for a new one (api.max_connections)", key)
        try:
            connection.send(json_canned(HTTPStatus.SERVICE_UNAVAILABLE, "evicted",
                                        "this connection waited without a whole request while every slot was taken; "
                                        "its slot went to a new connection", "send each request whole, at once"),
                            socket.MSG_DONTWAIT)  # fmt: skip
        except OSError:
            pass
        try:
            connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def service_actions(self) -> None:
        super().service_actions()  # type: ignore[misc]
        try:
            self._reap()
        except Exception:  # never let it end serve_forever
            logger.exception("API: closing slow connections failed")

    def _reap(self) -> None:
        now = time.monotonic()
        if now < self._next_reap_s:
            return
        self._next_reap_s = now + REAP_INTERVAL_S
        for connection, (deadline, phase) in list(self._deadlines.items()):
            if now < deadline or self._deadlines.get(connection) != (deadline, phase):
                continue
            self._deadlines.pop(connection, None)
            self.timed_out_connections += 1
            logger.info("API: closed a connection that took too long to send its %s", phase)
            if phase != "reply":  # the handler is waiting to read: tell the client why
                try:
                    connection.send(json_canned(HTTPStatus.REQUEST_TIMEOUT, "too_slow", f"the request's {phase} did not arrive in time",
                                                "send the whole request at once (api.header_timeout_s, api.body_timeout_s)"),
                                    socket.MSG_DONTWAIT)  # fmt: skip
                except OSError:
                    pass
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    def get_request(self) -> tuple[socket.socket, Any]:
        request, client_address = super().get_request()  # type: ignore[misc]
        with self._connections_lock:
            self._connections.add(request)
        self._waiting[request] = time.monotonic()
        return request, client_address

    def shutdown_request(self, request: Any) -> None:
        moved = self._to_loop.pop(request, None)
        if moved is not None and self.infer_loop is not None:  # its thread ended; the loop serves it from now on
            self.infer_loop.adopt(request, *moved)
            return
        self._prefixes.pop(request, None)
        with self._connections_lock:
            self._connections.discard(request)
            self._clients.pop(request, None)
        self._deadlines.pop(request, None)
        self._waiting.pop(request, None)
        super().shutdown_request(request)  # type: ignore[misc]

    @property
    def open_connections(self) -> int:
        with self._connections_lock:
            return len(self._connections)

    def close_connections(self) -> None:
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the peer
