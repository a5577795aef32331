"""The local API's event loop: the Open Inference Protocol's HTTP inference route without a thread per request.

A connection starts on a thread of its own (:mod:`~edgekit_runtime.agent.api`'s threading server, with the
connection cap, eviction and every check of :mod:`~edgekit_runtime.agent.http_handler`). Once it has been
answered an inference request and stays kept alive, the thread hands it to this loop (``adopt``), one thread
for all such connections. The loop reads every ready connection in one pass, parses the plain case of
``POST /v2/models/NAME[/versions/V]/infer`` itself, runs the requests that arrived together on their model in
one go (:meth:`~edgekit_runtime.agent.serving.InferenceServer.infer_together`: one runner call for a batch
when the model batches, with no hand-off to a batching worker) and writes the replies. Concurrent batch-1
clients so become one runner call per pass instead of a thread wake-up, a GIL hand-over and a queue
hand-off per request (``docs/agent.md``, "perf_analyzer and concurrent clients").

Anything else goes back to a thread with the bytes already read (``hand_back``), so it meets exactly the
checks and answers it met before: another method or path, a request line or header the plain parser does
not take (folded, no colon, not HTTP/1.1, ``Expect``, ``Transfer-Encoding``, ``Content-Encoding``, several or
no ``Content-Length``, ``Connection: close``), a refused ``Host``/``Origin`` or content type, a model not
found or without a bundle, a body over a limit or over the budget of bodies in flight, and a request whose
head and body have not all arrived within ``PARTIAL_HAND_BACK_S`` (the thread then applies
``header_timeout_s`` / ``body_timeout_s`` to the rest). The loop itself closes a connection idle for
``idle_timeout_s`` and one that does not take its reply within ``body_timeout_s``, and reads nothing more from a
connection while its reply waits to leave (a client that sends without reading is held back by TCP, not buffered
here); a body it holds is
reserved in the API's body budget until the reply is written, as on a thread. An error in decoding a
request or running the model is answered here, in the protocol's ``{"error": ...}`` format.
"""

from __future__ import annotations

import logging
import re
import selectors
import socket
import threading
import time
from collections import deque
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

from edgekit_runtime.agent.http_guard import body_limit_refusal, content_type_refusal
from edgekit_runtime.agent.http_handler import _HEADER_LINE, MAX_LENGTH_DIGITS, RequestHandler, json_body
from edgekit_runtime.agent.http_head import RequestHeaders
from edgekit_runtime.agent.oip import BINARY_TYPE, HEADER_LENGTH, JSON_TYPE, protocol_error
from edgekit_runtime.agent.oip_layouts import RequestLayout, RequestLayouts
from edgekit_runtime.agent.oip_types import OipError, find_slot
from edgekit_runtime.agent.serving_core import serving_error, timing_header_lines
from edgekit_runtime.errors import EdgekitError

logger = logging.getLogger("edgekit_runtime.agent.api")

#: a request whose head and body are not all in after this long goes to a thread (which applies the deadlines)
PARTIAL_HAND_BACK_S = 0.1
#: a model whose requests took longer than this on the loop, in SLOW_PASSES passes in a row, is served on threads
#: for SLOW_FOR_S, so that a slow model's requests never hold up another model's (then it is tried on the loop
#: again). Only where the agent serves more than one model: with one, there is no other model to hold up, and on
#: threads its concurrent requests are served one connection at a time (a tenth of the loop's rate at 16 clients).
#: Two passes, not one: one pass preempted by another process on a busy host is no slow model.
SLOW_ON_LOOP_S = 0.002
SLOW_PASSES = 2
SLOW_FOR_S = 10.0
_READ_BYTES = 256 * 1024
_TICK_S = 0.25
_MAX_HEADERS = 100
#: distinct request heads whose parse is kept (cleared when full)
_HEAD_CACHE = 256
_INFER_PATH = re.compile(r"/v2/models/([^/?#]+)(?:/versions/([^/?#]+))?/infer")
#: headers whose presence sends the request to a thread (it answers or handles them as before)
_THREAD_HEADERS = ("transfer-encoding", "expect", "content-encoding")
_REASONS = {status.value: status.phrase for status in HTTPStatus}
_INTERNAL_ERROR = "internal error in the agent; see its log"
#: a request read whole and decoded: (connection, slot, model name, its layout, input tensors, arrival stamp)
_Ready = tuple["_Connection", Any, str, RequestLayout, dict[str, Any], int]


class _Connection:
    __slots__ = ("sock", "address", "inbuf", "outbuf", "since", "partial_since", "reserved", "head", "writing")

    def __init__(self, sock: socket.socket, address: Any, leftover: bytes) -> None:
        self.sock, self.address = sock, address
        self.inbuf = bytearray(leftover)
        self.outbuf = b""
        self.since = time.monotonic()  # idle since (no request in hand), or writing a reply since
        self.partial_since = 0.0  # when the bytes of an incomplete request first arrived
        self.reserved = 0  # this request's body bytes in the API's budget
        self.head: tuple[int, Any, str, RequestHeaders, int] | None = None  # a parsed head whose body is still coming
        self.writing = False  # registered for EVENT_WRITE too (a reply did not leave in one send)


class InferLoop:
    """The event loop of ``api`` (an :class:`~edgekit_runtime.agent.api.AgentApi`) over connections of its
    threading server ``httpd`` (:class:`~edgekit_runtime.agent.http_connections.ConnectionTracking`)."""

    def __init__(self, api: Any, httpd: Any) -> None:
        self.api, self.httpd = api, httpd
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._selector.register(self._wake_read, selectors.EVENT_READ, None)
        self._adoptions: deque[tuple[socket.socket, Any, bytes]] = deque()
        self._connections: dict[socket.socket, _Connection] = {}
        self._stopping = False
        self._next_tick = 0.0
        self._date = ("", 0)
        self._server_header = ""
        self._head_starts: dict[tuple[int, str], str] = {}  # a reply head up to its Content-Length value, this second
        self._layouts = RequestLayouts()
        self._heads: dict[bytes, tuple[str, str, RequestHeaders, int] | tuple[()]] = {}
        self._last_limits: tuple[int, Any] | None = None
        self._slow_until: dict[int, float] = {}  # id(InferenceServer) -> until when its requests go to threads
        self._slow_passes: dict[int, int] = {}  # id(InferenceServer) -> its passes in a row over SLOW_ON_LOOP_S
        self._thread = threading.Thread(target=self._run, name="edgekit-api-loop", daemon=True)

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    @property
    def connections(self) -> int:
        """Connections the loop serves now."""
        return len(self._connections)

    @property
    def held_bytes(self) -> int:
        """Bytes held now over all connections: requests read and not yet served, replies not yet sent."""
        return sum(len(c.inbuf) + len(c.outbuf) for c in list(self._connections.values()))

    def start(self) -> InferLoop:
        self._thread.start()
        return self

    def adopt(self, sock: socket.socket, address: Any, leftover: bytes) -> None:
        """Serve ``sock`` from now on (called by the thread that answered its last request); ``leftover``:
        bytes of its next request already read."""
        self._adoptions.append((sock, address, leftover))
        self._wake()

    def stop(self) -> None:
        self._stopping = True
        self._wake()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for connection in list(self._connections.values()):
            self._close(connection)
        while self._adoptions:
            self.httpd.shutdown_request(self._adoptions.popleft()[0])
        self._selector.close()
        self._wake_read.close()
        self._wake_write.close()

    def _wake(self) -> None:
        try:
            self._wake_write.send(b"\0", socket.MSG_DONTWAIT)
        except OSError:
            pass  # a wake-up is already pending (the buffer is full), or the loop stopped

    # -- the loop ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        ready: list[_Ready] = []
        while not self._stopping:
            try:
                events = self._selector.select(_TICK_S)
                for key, mask in events:
                    connection = key.data
                    if connection is None:
                        self._take_adoptions(ready)
                        continue
                    if mask & selectors.EVENT_WRITE:
                        self._flush(connection)
                        if connection.inbuf and not connection.outbuf and connection.sock in self._connections:
                            self._parse(connection, ready)  # a request read before the reply got stuck
                    if mask & selectors.EVENT_READ and connection.sock in self._connections:
                        self._read(connection, ready)
                while ready:
                    batch, ready = ready, []
                    self._serve(batch)
                    for connection, *_ in batch:  # a pipelined next request already in the buffer
                        if connection.inbuf and not connection.outbuf and connection.sock in self._connections:
                            self._parse(connection, ready)
                now = time.monotonic()
                if now >= self._next_tick:
                    self._next_tick = now + _TICK_S
                    self._reap(now)
            except Exception:  # never let the loop die: its connections would hang
                logger.exception("API event loop: a pass failed")
                for connection, *_ in ready:
                    self._close(connection)
                ready = []

    def _take_adoptions(self, ready: list[Any]) -> None:
        try:
            while self._wake_read.recv(4096):
                pass
        except OSError:
            pass
        while self._adoptions:
            sock, address, leftover = self._adoptions.popleft()
            if self._stopping:
                self.httpd.shutdown_request(sock)
                continue
            try:
                sock.setblocking(False)
                connection = _Connection(sock, address, leftover)
                self._selector.register(sock, selectors.EVENT_READ, connection)
            except (OSError, ValueError):  # closed meanwhile (stop, eviction)
                self.httpd.shutdown_request(sock)
                continue
            self._connections[sock] = connection
            self.httpd.mark_waiting(sock)
            if leftover:  # the next request, or its start, arrived before the thread let go
                self._parse(connection, ready)

    def _read(self, connection: _Connection, ready: list[Any]) -> None:
        try:
            data = connection.sock.recv(_READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(connection)
            return
        if not data:  # the client closed, or a shutdown (eviction, stop)
            self._close(connection)
            return
        connection.inbuf += data
        if connection.outbuf:  # read in the pass that left a reply unsent: parsed once it has left
            return
        self._parse(connection, ready)

    def _parse(self, connection: _Connection, ready: list[Any]) -> None:
        """Take one whole plain inference request off ``connection``'s buffer into ``ready`` (or answer its
        error, then take the next one the buffer holds), wait for the rest of it, or hand the connection back to a
        thread."""
        buffer = connection.inbuf
        while True:
            if connection.head is None:
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(buffer) > self.api.max_header_bytes or b"\n\n" in buffer:
                        self._hand_back(connection)
                    elif not connection.partial_since:
                        connection.partial_since = time.monotonic()
                    return
                head = self._plain_head(buffer, end)
                if head is None:
                    self._hand_back(connection)
                    return
                connection.head = head
                self.httpd.mark_serving(connection.sock)
                refusal = self.api.body_budget.reserve(head[4])
                if refusal is not None:
                    self._hand_back(connection)  # the thread answers 503 busy_bodies (or 413)
                    return
                connection.reserved = head[4]
            end, slot, name, headers, length = connection.head
            body_end = end + 4 + length
            if len(buffer) < body_end:
                if not connection.partial_since:
                    connection.partial_since = time.monotonic()
                return
            submitted_ns = time.perf_counter_ns()
            body = bytearray(memoryview(buffer)[end + 4 : body_end])
            del buffer[:body_end]
            connection.head, connection.partial_since = None, 0.0
            try:
                layout, feeds = self._layouts.decode(slot, name, headers.get(HEADER_LENGTH), body)
            except Exception as err:
                self._reply_exception(connection, err, "decoding an inference request", name)
                if buffer and not connection.outbuf and connection.sock in self._connections:
                    continue  # a request pipelined after the refused one: nothing else would parse it but the reaper
                return
            ready.append((connection, slot, name, layout, feeds, submitted_ns))
            return

    def _plain_head(self, buffer: bytearray, end: int) -> tuple[int, Any, str, RequestHeaders, int] | None:
        """The head ending at ``end`` as (end, slot, model name, headers, body length) when it is a plain
        inference request this loop serves; ``None`` sends the connection back to a thread. What depends on
        the head's bytes alone (its parse, the web-page and content-type checks) is kept per distinct head:
        a client sends the same head request after request."""
        if end + 4 > self.api.max_header_bytes:
            return None
        raw = bytes(buffer[:end])
        parsed = self._heads.get(raw)
        if parsed is None:
            parsed = self._parse_head(raw)
            if len(self._heads) >= _HEAD_CACHE:
                self._heads.clear()
            self._heads[raw] = parsed
        if not parsed:
            return None
        model, version, headers, length = parsed
        try:
            slot = find_slot(self.api.models, model, version)
        except OipError:
            return None
        signature = slot.server.signature
        if signature is None or length > self.api.max_request_bytes:
            return None
        if self._slow_until and self._slow_until.get(id(slot.server), 0.0) > time.monotonic():
            return None  # a slow model: its requests run on threads, so that they never hold up the loop's others
        limits = (length, signature)
        if limits != self._last_limits:  # the body limit's answer for this length and signature
            if body_limit_refusal(length, signature, model, setting="api.max_request_mb") is not None:
                return None
            self._last_limits = limits
        return end, slot, model, headers, length

    def _parse_head(self, raw: bytes) -> tuple[str, str, RequestHeaders, int] | tuple[()]:
        """(model, version, headers, body length) of a plain inference head, ``()`` for anything else."""
        lines = raw.split(b"\r\n")
        words = lines[0].split(b" ")
        if len(words) != 3 or words[0] != b"POST" or words[2] != b"HTTP/1.1" or len(lines) - 1 > _MAX_HEADERS:
            return ()
        matched = _INFER_PATH.fullmatch(words[1].decode("iso-8859-1"))
        if matched is None:
            return ()
        items = []
        for line in lines[1:]:
            if not _HEADER_LINE.match(line) or b"\n" in line or b"\r" in line:  # a bare LF: the threads read the head line by line
                return ()
            name, _, value = line.decode("iso-8859-1").partition(":")
            items.append((name, value.strip(" \t")))  # optional whitespace on both sides is no part of a value (RFC 9110 5.5)
        headers = RequestHeaders(items)
        lengths = headers.get_all("Content-Length") or []
        if len(lengths) != 1 or not (lengths[0].isascii() and lengths[0].isdigit()) or len(lengths[0]) > MAX_LENGTH_DIGITS:
            return ()  # (the threads answer each of these)
        if any(name in headers for name in _THREAD_HEADERS) or (headers.get("Connection") or "").lower() == "close":
            return ()
        if self.api.browser_refusal(headers) is not None:
            return ()
        if content_type_refusal(headers.get("Content-Type"), (JSON_TYPE, BINARY_TYPE)) is not None:
            return ()
        return matched.group(1), matched.group(2) or "", headers, int(lengths[0])

    def _serve(self, batch: list[_Ready]) -> None:
        """Run the requests that arrived together, per model, and write their replies."""
        by_server: dict[int, list[_Ready]] = {}
        for item in batch:
            by_server.setdefault(id(item[1].server), []).append(item)
        layouts = self._layouts
        for items in by_server.values():
            server = items[0][1].server
            started = time.monotonic()
            try:
                results = server.infer_together([(item[4], item[5]) for item in items])
            except Exception as err:  # a bug: every request gets a 500
                logger.exception("API event loop: running %d request(s) failed", len(items))
                results = [err] * len(items)
            if time.monotonic() - started > SLOW_ON_LOOP_S:
                self._note_slow_pass(server)
            elif self._slow_passes:
                self._slow_passes.pop(id(server), None)
            for (connection, slot, name, layout, _, _), result in zip(items, results):
                if isinstance(result, Exception):
                    self._reply_failure(connection, name, result)
                    continue
                try:
                    body, content_type, extra = layouts.encode(layout, slot, result.outputs)
                except Exception as err:
                    self._reply_exception(connection, err, "the reply", name)
                    continue
                lines = timing_header_lines(result) + "".join(f"{key}: {value}\r\n" for key, value in extra.items())
                self._send(connection, 200, body, content_type, lines)

    def _note_slow_pass(self, server: Any) -> None:
        """A pass of ``server`` held up every other connection: after SLOW_PASSES in a row, and where another model
        could be held up, its requests go to threads for SLOW_FOR_S."""
        passes = self._slow_passes.get(id(server), 0) + 1
        if passes < SLOW_PASSES or len(self.api.models.slots()) < 2:
            self._slow_passes[id(server)] = passes
            return
        self._slow_passes.pop(id(server), None)
        self._slow_until[id(server)] = time.monotonic() + SLOW_FOR_S

    def _reply_failure(self, connection: _Connection, name: str, err: Exception) -> None:
        if isinstance(err, EdgekitError):
            failure = protocol_error(name, serving_error(err))
            self._reply_error(connection, failure.status, failure.message)
            return
        logger.error("API event loop: model %s failed: %s: %s", name, type(err).__name__, err)
        self._reply_error(connection, HTTPStatus.INTERNAL_SERVER_ERROR, _INTERNAL_ERROR)

    def _reply_exception(self, connection: _Connection, err: Exception, doing: str, name: str) -> None:
        """Answer ``err``, raised while ``doing`` for model ``name``: the protocol's error as it words it, anything
        else (a bug) logged with its traceback and answered 500."""
        if isinstance(err, OipError):
            self._reply_error(connection, err.status, err.message, err.headers)
            return
        logger.error("API event loop: %s for %s failed", doing, name, exc_info=err)
        self._reply_error(connection, HTTPStatus.INTERNAL_SERVER_ERROR, _INTERNAL_ERROR)

    def _reply_error(self, connection: _Connection, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        body, extra = json_body({"error": message})
        lines = "".join(f"{key}: {value}\r\n" for key, value in {**(headers or {}), **extra}.items())
        self._send(connection, int(status), body, JSON_TYPE, lines)

    # -- writing ----------------------------------------------------------------------------------------

    def _head(self, status: int, content_type: str, length: int, lines: str) -> bytes:
        """A reply's head; ``lines``: its further header lines, each ending in CRLF. What is the same for every
        reply of this status and content type within a second (status line, Server, Date, Content-Type) is
        made once."""
        now = int(time.time())
        if self._date[1] != now:
            self._date = (formatdate(now, usegmt=True), now)
            self._head_starts.clear()
            if not self._server_header:
                self._server_header = f"{RequestHandler.server_version} {RequestHandler.sys_version}".strip()
        start = self._head_starts.get((status, content_type))
        if start is None:
            start = (f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nServer: {self._server_header}\r\nDate: {self._date[0]}\r\n"
                     f"Content-Type: {content_type}\r\nContent-Length: ")  # fmt: skip
            self._head_starts[(status, content_type)] = start
        return f"{start}{length}\r\n{lines}\r\n".encode("latin-1")

    def _send(self, connection: _Connection, status: int, body: bytes, content_type: str, lines: str) -> None:
        if connection.reserved:  # before the reply leaves, so that the client's next body finds its bytes free
            self.api.body_budget.release(connection.reserved)
            connection.reserved = 0
        connection.outbuf = self._head(status, content_type, len(body), lines) + body
        connection.since = time.monotonic()
        self._flush(connection)

    def _flush(self, connection: _Connection) -> None:
        try:
            sent = connection.sock.send(connection.outbuf)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(connection)
            return
        connection.outbuf = connection.outbuf[sent:]
        if connection.outbuf:
            if not connection.writing:  # and no reading meanwhile: a client that takes no replies is held back by TCP
                self._selector.modify(connection.sock, selectors.EVENT_WRITE, connection)
                connection.writing = True
            return
        if connection.writing:  # one epoll_ctl when the rest has left, none for a reply that left in one send
            self._selector.modify(connection.sock, selectors.EVENT_READ, connection)
            connection.writing = False
        connection.since = time.monotonic()
        self.httpd.mark_waiting(connection.sock)
        if connection.inbuf and connection.head is None:  # the next request arrived while this reply left
            connection.partial_since = connection.partial_since or connection.since

    # -- handing back, deadlines, closing ---------------------------------------------------------------

    def _hand_back(self, connection: _Connection) -> None:
        """Let a thread serve ``connection`` from the bytes already read (the API's checks and answers)."""
        self._forget(connection)
        try:
            connection.sock.setblocking(True)
        except OSError:
            self.httpd.shutdown_request(connection.sock)
            return
        self.httpd.serve_on_thread(connection.sock, connection.address, bytes(connection.inbuf))

    def _reap(self, now: float) -> None:
        api = self.api
        for connection in list(self._connections.values()):
            if connection.outbuf:
                if now - connection.since > api.body_timeout_s:
                    logger.info("API: closed a connection that took too long to take its reply")
                    self.httpd.timed_out_connections += 1
                    self._close(connection)
            elif connection.partial_since:
                if now - connection.partial_since > PARTIAL_HAND_BACK_S:
                    self._hand_back(connection)
            elif now - connection.since > api.idle_timeout_s:
                self._close(connection)

    def _forget(self, connection: _Connection) -> None:
        self._connections.pop(connection.sock, None)
        try:
            self._selector.unregister(connection.sock)
        except (KeyError, ValueError, OSError):
            pass
        if connection.reserved:
            self.api.body_budget.release(connection.reserved)
            connection.reserved = 0

    def _close(self, connection: _Connection) -> None:
        self._forget(connection)
        self.httpd.shutdown_request(connection.sock)
