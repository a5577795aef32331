"""The local API's HTTP plumbing, below every protocol it serves: one :class:`RequestHandler` per connection
reads each request line and headers within their limits, refuses malformed framing and web pages before
any endpoint sees the request, reads bodies as they arrive (bounded from ``Content-Length``: the API's
limit, what the model can need, the budget of bodies in flight), then hands the request to ``/v1``'s routes
(``api.get_routes`` / ``api.post_routes``, :mod:`edgekit_runtime.agent.api`) or to the Open Inference
Protocol (``api.v2_handler``, :mod:`edgekit_runtime.agent.oip`). :class:`ApiError` is the error of this
layer; each protocol words it in its own error format.
"""

from __future__ import annotations

import io
import json
import zlib
import logging
import math
import re
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any

from edgekit_runtime.agent.body_budget import RETRY_AFTER_S
from edgekit_runtime.agent.http_guard import Refusal, body_limit_refusal, json_body_limit
from edgekit_runtime.agent.http_head import parse_plain_head
from edgekit_runtime.agent.serving import InferenceServer
from edgekit_runtime.agent.wire import JSON_CONTENT_TYPE

logger = logging.getLogger("edgekit_runtime.agent.api")

#: a body's buffer starts at most this big and doubles as bytes arrive (never sized from Content-Length)
_FIRST_BODY_BUFFER_BYTES = 64 * 1024
_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}
#: a header line: a token (RFC 9110 5.6.2), then a colon with no whitespace before it
_HEADER_LINE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:")
_METHODS = ("GET", "POST")
#: the most digits a Content-Length may have (leading zeros aside): 10**18 bytes is past any limit this API has
MAX_LENGTH_DIGITS = 18
#: http.server's own refusals (parse_request) -> the API's error kinds
_REFUSAL_KINDS = {HTTPStatus.BAD_REQUEST: "bad_request", HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE: "headers_too_large",
                  HTTPStatus.HTTP_VERSION_NOT_SUPPORTED: "http_version_not_supported"}  # fmt: skip


def _finite_json(value: Any, counter: list[int]) -> Any:
    """``value`` with every non-finite float spelled as a string (``"NaN"``, ``"Infinity"``, ``"-Infinity"``)."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        counter[0] += 1
        return _NON_FINITE.get(value, "NaN")
    if isinstance(value, dict):
        return {key: _finite_json(item, counter) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_json(item, counter) for item in value]
    return value


def json_body(payload: Any) -> tuple[bytes, dict[str, str]]:
    """``payload`` as a JSON reply body, and the headers it needs: a NaN or infinity is spelled as a string and
    counted in ``X-Edgekit-Non-Finite`` (no header when there is none)."""
    try:
        return json.dumps(payload, allow_nan=False).encode("utf-8"), {}
    except ValueError:  # NaN or an infinity somewhere: spelled as strings, counted in a header
        counter = [0]
        body = json.dumps(_finite_json(payload, counter), allow_nan=False).encode("utf-8")
        return body, {"X-Edgekit-Non-Finite": str(counter[0])}


class ApiError(Exception):
    """A request refused or failed at the HTTP layer or by an endpoint: status, kind, message, hint, extra fields."""

    def __init__(self, status: HTTPStatus, kind: str, message: str, hint: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.hint, self.extra = status, kind, message, hint, extra
        #: headers the answer carries (``Retry-After`` for a body refused for the in-flight budget)
        self.headers: dict[str, str] = {}

    @classmethod
    def from_refusal(cls, refusal: Refusal) -> ApiError:
        return cls(refusal.status, refusal.kind, refusal.message, refusal.hint)


class RequestHandler(BaseHTTPRequestHandler):
    server_version = "edgekit-agent"
    protocol_version = "HTTP/1.1"
    api: Any  # the AgentApi, set on the per-server subclass, with ``timeout`` (the idle timeout)
    _requests_started = 0  # per connection (set on the instance)
    _reserved_body_bytes = 0  # this request's share of the API's body budget (set on the instance)
    #: buffered, so that a reply's status line, headers and body leave in one write (http.server flushes
    #: after each request); a body larger than this goes out in a write of its own
    wbufsize = 64 * 1024

    #: set by the OIP inference route once it answered: the connection may move to the API's event loop
    served_infer = False
    #: the request asked for ``100 Continue`` before its body (see :meth:`handle_expect_100`)
    _expects_continue = False

    # -- plumbing -------------------------------------------------------------------------------------

    def handle_expect_100(self) -> bool:
        """``Expect: 100-continue``: nothing yet; :meth:`read_body` sends the interim reply once the request passed
        the Host, Origin, content-type and size checks (a refused request's client never uploads its body)."""
        self._expects_continue = True
        return True

    def _continue(self) -> None:
        """The interim ``100 Continue`` a client that sent ``Expect: 100-continue`` waits for, sent now, at once
        (the write buffer would hold it until the final reply: the client stalled for a second, or its timeout)."""
        if self._expects_continue:
            self._expects_continue = False
            self.send_response_only(HTTPStatus.CONTINUE)
            self.end_headers()
            self.wfile.flush()

    def finish(self) -> None:
        """Close the connection's files; a client already gone (a reset, a reply the reaper cut off) is no error
        (socketserver printed each such BrokenPipeError's traceback to stderr, outside the log)."""
        try:
            super().finish()
        except OSError as err:
            logger.debug("API connection from %s closed while its reply was written: %s", self.address_string(), err)

    def setup(self) -> None:
        super().setup()
        prefix = self.server.take_prefix(self.connection)  # type: ignore[attr-defined]
        if prefix:  # back from the event loop, which read these bytes of the next request already
            self.rfile = io.BufferedReader(_PrefixedReader(prefix, self.rfile), self.rbufsize if self.rbufsize > 0 else io.DEFAULT_BUFFER_SIZE)
            self._requests_started = 1

    def handle(self) -> None:
        """Requests until the connection closes, or until it is a kept-alive inference connection: those move
        to the API's event loop (:mod:`~edgekit_runtime.agent.http_loop`) and this thread ends."""
        self.close_connection = True
        self.handle_one_request()
        while not self.close_connection:
            if self.served_infer and self._move_to_loop():
                return
            self.handle_one_request()

    def _move_to_loop(self) -> bool:
        try:
            self.wfile.flush()
            self.connection.setblocking(False)
            leftover = _already_read(self.rfile)
        except OSError:
            return False
        finally:
            try:
                self.connection.settimeout(self.timeout)
            except OSError:
                pass
        if self.server.move_to_loop(self.connection, self.client_address, leftover or b""):  # type: ignore[attr-defined]
            return True
        if leftover:  # no loop after all: keep serving here, these bytes first
            self.rfile = io.BufferedReader(_PrefixedReader(leftover, self.rfile))
        return False

    def address_string(self) -> str:
        return self.client_address[0] if isinstance(self.client_address, tuple) else "unix"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        logger.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: HTTPStatus, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self._release_body()  # before the reply leaves, so that the client's next body finds its bytes free
        self.server.set_deadline(self.connection, self.api.body_timeout_s, "reply")  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection and "Connection" not in (headers or {}):  # e.g. a body left unread: say so, or
            self.send_header("Connection", "close")  # a keep-alive client sends its next request into a closed socket
        self.end_headers()
        if self.command != "HEAD":  # a reply to HEAD never carries a body (RFC 9110 9.3.2), even a refusal's
            self.wfile.write(body)

    def _send_json(self, status: HTTPStatus, payload: Any, headers: dict[str, str] | None = None) -> None:
        body, extra = json_body(payload)
        self._send(status, body, JSON_CONTENT_TYPE, {**headers, **extra} if headers and extra else headers or extra or None)

    def _send_error(self, err: ApiError) -> None:
        payload = {"error": err.kind, "message": err.message, "hint": err.hint, **err.extra}
        self._send_json(err.status, payload, err.headers or None)

    def _refuse(self, err: ApiError) -> None:
        """Answer a request refused before any endpoint saw it, then close the connection (its framing cannot
        be trusted): in the API's error format, or the Open Inference Protocol's for a path under ``/v2``."""
        if self.request_version == "HTTP/0.9":  # http.server writes no status line nor headers for HTTP/0.9
            self.request_version = "HTTP/1.1"
        if self._is_v2():
            payload: dict[str, Any] = {"error": err.message + (f"; {err.hint}" if err.hint else "")}
        else:
            payload = {"error": err.kind, "message": err.message, "hint": err.hint}
        self._send_json(err.status, payload, {"Connection": "close"})  # sets close_connection

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (parse_request: request version, too many or too long headers) in the
        API's JSON format, always with a status line."""
        status = HTTPStatus(code)
        hint = "send 'METHOD /path HTTP/1.1', then one 'Name: value' line per header"
        self._refuse(ApiError(status, _REFUSAL_KINDS.get(status, "bad_request"), message or status.phrase,
                               hint=explain or hint))  # fmt: skip

    def handle_one_request(self) -> None:
        """One request: wait (idle timeout) for its first byte, read the request line and headers within
        the header limits, then the ``do_*`` method. Deadlines are enforced by the server's reaper.
        A new connection's first request must start within ``header_timeout_s`` too, so that idle
        connections cannot hold the connection slots for the whole idle timeout."""
        server = self.server
        try:
            if not self._requests_started:
                server.set_deadline(self.connection, self.api.header_timeout_s, "headers")  # type: ignore[attr-defined]
            else:
                server.mark_waiting(self.connection)  # type: ignore[attr-defined]
            self._requests_started += 1
            if not self.rfile.peek(1):  # the client closed the connection; the socket timeout is the idle timeout
                self.close_connection = True
                return
            server.set_deadline(self.connection, self.api.header_timeout_s, "headers")  # type: ignore[attr-defined]
            self._expects_continue = False  # a request before on this connection may have left it set
            if not self._read_request_head():  # (this request's own Expect header sets it: handle_expect_100)
                self.close_connection = True
                return
            if self.command != "POST" or (self.headers.get("Content-Length") or "0").strip(" \t").lstrip("0") == "":
                server.mark_serving(self.connection)  # type: ignore[attr-defined]  # a whole request: no body to come
            # (a POST with a body is serving once its body is in, read_body: until then a stalled body may be evicted)
            refusal = self.api.browser_refusal(self.headers)
            if refusal is not None:
                logger.info("API: refused %s %s from %s: %d %s (%s)", self.command, self.path[:80], self.address_string(),
                            refusal.status.value, refusal.kind, refusal.message)  # fmt: skip
                self._refuse(ApiError.from_refusal(refusal))
                return
            if self.command not in _METHODS:
                self._refuse(ApiError(HTTPStatus.NOT_IMPLEMENTED, "method_not_implemented",
                                       f"method {self.command[:32]!r} is not implemented",
                                       hint=f"this API answers {' and '.join(_METHODS)}"))  # fmt: skip
                return
            getattr(self, f"do_{self.command}")()
            self.wfile.flush()
        except (TimeoutError, OSError) as err:  # idle timeout, a deadline's shutdown, or the client went away
            logger.debug("API connection from %s closed: %s", self.address_string(), err)
            self.close_connection = True
        finally:
            server.clear_deadline(self.connection)  # type: ignore[attr-defined]
            self._release_body()

    def _release_body(self) -> None:
        """Give the request body's bytes back to the API's budget (its request is answered, or failed)."""
        if self._reserved_body_bytes:
            self.api.body_budget.release(self._reserved_body_bytes)
            self._reserved_body_bytes = 0

    def _read_request_head(self) -> bool:
        """Read the request line and headers (at most ``max_header_bytes``) and parse them; False when
        the connection is to be closed (an error was answered, or the client went away)."""
        self.command, self.request_version, self.requestline = None, "HTTP/1.1", ""  # type: ignore[assignment]
        self.path = ""
        limit = self.api.max_header_bytes
        lines: list[bytes] = []
        size = 0
        while True:
            line = self.rfile.readline(limit - size + 1)
            size += len(line)
            if size > limit:
                self.close_connection = True
                self._send_error(ApiError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "headers_too_large",
                                           f"request line and headers are over the limit of {limit} bytes",
                                           hint="send fewer or shorter headers, or raise api.max_header_kb"))  # fmt: skip
                return False
            if not line.endswith(b"\n"):
                return False  # the client closed the connection mid-request
            if not lines and line in (b"\r\n", b"\n"):
                continue  # empty lines before a request line are ignored (RFC 9112 2.2)
            lines.append(line)
            if line in (b"\r\n", b"\n"):
                break
        problem = _malformed_head(lines)
        if problem is not None:
            self._refuse(problem)
            return False
        self.raw_requestline = lines[0]
        if not parse_plain_head(self, lines):  # not a plain HTTP/1.1 head: the standard library parses it
            socket_file, self.rfile = self.rfile, io.BytesIO(b"".join(lines[1:]))
            try:
                if not self.parse_request():  # answers 400 / 431 / 505 itself (send_error) when it returns False
                    return False
            finally:
                self.rfile = socket_file
        problem = _unreadable_framing([value.strip(" \t") for value in self.headers.get_all("Content-Length") or []],
                                      self.headers.get_all("Transfer-Encoding") or [])  # fmt: skip
        if problem is not None:
            self._refuse(problem)
            return False
        return True

    def _dispatch(self, routes: dict[str, Callable[[], None]]) -> None:
        path = self.path.split("?", 1)[0]
        try:
            handler = routes.get(path)
            if handler is None:
                known = sorted({*self.api.get_routes, *self.api.post_routes})
                if path in known:
                    raise ApiError(HTTPStatus.METHOD_NOT_ALLOWED, "method_not_allowed", f"{self.command} is not allowed on {path}")
                raise ApiError(HTTPStatus.NOT_FOUND, "not_found", f"no endpoint {path}", hint=f"endpoints: {', '.join(known)}")
            handler()
        except ApiError as err:
            self._drain_body()
            self._send_error(err)
        except (ConnectionError, TimeoutError):  # the client went away (a reset mid-body): no one to answer, no agent fault
            self.close_connection = True
            raise
        except Exception:  # a bug: answer 500 rather than dropping the connection
            logger.exception("API handler for %s %s failed", self.command, path)
            self._drain_body()  # a body the handler did not read must not be parsed as the next request
            self._send_error(ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, "internal", "internal error in the agent; see its log"))

    def _drain_body(self) -> None:
        if getattr(self, "_body_read", True):
            return
        self.close_connection = True

    def _is_v2(self) -> bool:
        return self.path == "/v2" or self.path.startswith(("/v2/", "/v2?"))

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._body_read = True
        if self.headers.get("Content-Length", "0") != "0":
            self.close_connection = True  # a GET's body is never read: the connection cannot carry another request
        if self._is_v2():
            self._dispatch_v2()
            return
        self._dispatch({path: lambda fn=fn: fn(self) for path, fn in self.api.get_routes.items()})

    def do_POST(self) -> None:  # noqa: N802
        self._body_read = False
        if self._is_v2():
            self._dispatch_v2()
            return
        self._dispatch({path: lambda fn=fn: fn(self) for path, fn in self.api.post_routes.items()})

    def _dispatch_v2(self) -> None:
        """The Open Inference Protocol (``api.v2_handler``: :mod:`edgekit_runtime.agent.oip`), with its own error objects."""
        try:
            self.api.v2_handler(self, self.command)
        except Exception:  # a bug: answer 500 rather than dropping the connection
            logger.exception("API handler for %s %s failed", self.command, self.path)
            self._drain_body()
            self._send_json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error in the agent; see its log"})

    def read_body(self, server: InferenceServer | None = None, model: str | None = None) -> bytearray:
        """The request body, read as it arrives: refused (413) from Content-Length when over the limit or
        larger than ``server``'s model can need (see :func:`~edgekit_runtime.agent.http_guard.json_body_limit`),
        refused (503, or 413) when it does not fit in the API's budget for bodies in flight
        (:mod:`~edgekit_runtime.agent.body_budget`; reserved until the request is answered), held in a
        buffer that starts small and doubles with the bytes received, due within ``body_timeout_s``."""
        length_text = self.headers.get("Content-Length")
        length_text = length_text.strip(" \t") if length_text is not None else None
        if length_text is None or not length_text.isdigit() or not length_text.isascii():
            raise ApiError(HTTPStatus.LENGTH_REQUIRED, "length_required", "send a Content-Length header with the body's size in bytes")
        length = int(length_text.lstrip("0") or "0")  # (the framing check refused more than MAX_LENGTH_DIGITS digits)
        if length > self.api.max_request_bytes:
            raise ApiError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                "too_large",
                f"request body of {length} bytes is over the limit of {self.api.max_request_bytes}",
                hint="split the batch, or raise api.max_request_mb in the agent config",
            )
        signature = None if server is None else server.signature
        if signature is not None:
            refusal = body_limit_refusal(length, signature, model or str(server.model_name), setting="api.max_request_mb")  # type: ignore[union-attr]
            if refusal is not None:
                raise ApiError.from_refusal(refusal)
        refusal = self.api.body_budget.reserve(length)
        if refusal is not None:
            logger.info("API: refused a body of %d bytes from %s: %s", length, self.address_string(), refusal.message)
            err = ApiError.from_refusal(refusal)
            if refusal.status == HTTPStatus.SERVICE_UNAVAILABLE:  # it fits once others are answered
                err.headers["Retry-After"] = str(RETRY_AFTER_S)
            raise err
        self._reserved_body_bytes = length
        self.server.set_deadline(self.connection, self.api.body_timeout_s, "body")  # type: ignore[attr-defined]
        self._continue()
        body = bytearray(min(length, _FIRST_BODY_BUFFER_BYTES))
        received = 0
        while received < length:
            if received == len(body):
                _grow(body, min(2 * len(body), length))
            count = self.rfile.readinto1(memoryview(body)[received:])
            if not count:
                raise ApiError(HTTPStatus.BAD_REQUEST, "truncated", f"body ended after {received} of {length} bytes")
            received += count
        self._body_read = True
        self.server.clear_deadline(self.connection)  # type: ignore[attr-defined]  # inference has no deadline
        self.server.mark_serving(self.connection)  # type: ignore[attr-defined]  # a whole request in hand
        coding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if coding != "identity":
            limit = self.api.max_request_bytes
            if signature is not None:
                limit = min(limit, json_body_limit(signature) or limit)
            body = self._decompress(body, coding, limit)
        return body

    def _decompress(self, body: bytearray, coding: str, limit: int) -> bytearray:
        """``body`` decoded from its ``Content-Encoding`` (gzip, or deflate: zlib-wrapped, RFC 9110 8.4.1), a
        megabyte at a time: each piece is reserved in the API's body budget before it is kept, and more than
        ``limit`` bytes decoded is refused (413), so a small compressed body cannot decode into a large one.
        The decoder is fed slices of the body, small at the start of each further gzip member and doubling up
        to ``_FEED_MAX_BYTES``, so what zlib copies of the input left over (after each member's end too) stays in
        proportion to the body: a body of many tiny members costs linear time, and more than
        ``MAX_GZIP_MEMBERS`` of them is refused (400)."""
        wbits = _WBITS.get(coding)
        if wbits is None:
            raise ApiError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "unsupported_content_encoding",
                           f"Content-Encoding {coding[:40]!r} is not supported",
                           hint="send the body as it is, or compressed with gzip or deflate")  # fmt: skip
        decoder = zlib.decompressobj(wbits)
        decoded = bytearray()
        pending: bytes | bytearray = b""  # body[start - len(pending) : start], not yet taken by the decoder
        start, feed, members = 0, _FEED_MAX_BYTES, 1  # one copy of the rest after the first member's end is no harm
        try:
            while True:
                if not pending and start < len(body):
                    pending = body[start : start + feed]
                    start, feed = start + len(pending), min(2 * feed, _FEED_MAX_BYTES)
                piece = decoder.decompress(pending, _DECODE_PIECE_BYTES)
                pending = decoder.unconsumed_tail
                if len(decoded) + len(piece) > limit:
                    raise ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "too_large",
                                   f"the {coding} body decodes to more than {limit} bytes (the limit for this request)",
                                   hint="send a smaller batch, or raise api.max_request_mb")  # fmt: skip
                self._reserve_more(len(piece))
                decoded += piece
                if decoder.eof:
                    start -= len(decoder.unused_data)  # where the member ended: the rest is read from the body again
                    if start == len(body):
                        break
                    if wbits != _WBITS["gzip"] or body[start : start + 2] != b"\x1f\x8b":  # gzip allows members one after another (RFC 1952 2.2)
                        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_content_encoding", f"the {coding} body has "
                                       f"{len(body) - start} bytes after its end marker",
                                       hint=f"send only the {coding} data")  # fmt: skip
                    members += 1
                    if members > MAX_GZIP_MEMBERS:
                        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_content_encoding", f"the {coding} body has more than "
                                       f"{MAX_GZIP_MEMBERS} members (compressed streams one after another)",
                                       hint="compress the whole body as one gzip stream")  # fmt: skip
                    pending, decoder, feed = b"", zlib.decompressobj(wbits), _FEED_FIRST_BYTES
                    continue
                if not piece and not pending and start == len(body):
                    break
        except zlib.error as err:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_content_encoding", f"the body is not valid {coding} data ({err})",
                           hint=f"compress the whole body with {coding}, or leave Content-Encoding out") from err  # fmt: skip
        if not decoder.eof:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_content_encoding", f"the {coding} body ends before its end marker",
                           hint="send the whole compressed body")  # fmt: skip
        body.clear()
        return decoded

    def _reserve_more(self, length: int) -> None:
        """Add ``length`` bytes to this request's share of the API's body budget (503 / 413 when they do not fit)."""
        refusal = self.api.body_budget.reserve(length)
        if refusal is not None:
            err = ApiError.from_refusal(refusal)
            if refusal.status == HTTPStatus.SERVICE_UNAVAILABLE:
                err.headers["Retry-After"] = str(RETRY_AFTER_S)
            raise err
        self._reserved_body_bytes += length


def _already_read(reader: Any) -> bytes:
    """Every byte ``reader`` (the connection's reader, its socket non-blocking) holds or can read without waiting,
    in order, taken out of it: its buffer, then what each layer below it holds (a connection back from the event
    loop reads through a :class:`_PrefixedReader` over the socket's own buffered reader, and each buffers)."""
    if isinstance(reader, io.BufferedReader):
        buffered = reader.peek(1)  # what is buffered, or one read of what has arrived
        taken = reader.read1(len(buffered)) if buffered else b""
        return taken + _already_read(reader.raw)
    if isinstance(reader, _PrefixedReader):
        return reader.take_prefix() + _already_read(reader.source)
    return b""  # the socket itself: what arrived since is read by whoever serves the connection next


class _PrefixedReader(io.RawIOBase):
    """``prefix``, then what ``source`` (the connection's reader) gives: a request whose first bytes were read
    elsewhere (the event loop) continues on a thread as if none had been taken."""

    def __init__(self, prefix: bytes, source: Any) -> None:
        self._prefix, self._source = memoryview(prefix), source

    @property
    def source(self) -> Any:
        return self._source

    def take_prefix(self) -> bytes:
        """What is left of the prefix, taken out of it."""
        rest, self._prefix = bytes(self._prefix), memoryview(b"")
        return rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._prefix:
            count = min(len(buffer), len(self._prefix))
            buffer[:count] = self._prefix[:count]
            self._prefix = self._prefix[count:]
            return count
        read: int = self._source.readinto1(buffer) if hasattr(self._source, "readinto1") else self._source.readinto(buffer)
        return read

    def close(self) -> None:
        super().close()
        self._source.close()


_ZEROS = bytes(1024 * 1024)
#: Content-Encoding -> zlib's wbits for it; decoded a piece of this many bytes at a time
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_DECODE_PIECE_BYTES = 1024 * 1024
#: the decoder is fed the body _FEED_MAX_BYTES at a time, and from the start of each further gzip member
#: _FEED_FIRST_BYTES, twice as many each time after; a gzip body of more members than MAX_GZIP_MEMBERS is refused
_FEED_FIRST_BYTES, _FEED_MAX_BYTES = 512, 256 * 1024
MAX_GZIP_MEMBERS = 1024


def _grow(body: bytearray, size: int) -> None:
    """Extend ``body`` with zeros to ``size`` bytes, a megabyte at a time (``extend(bytes(n))`` would hold an
    ``n``-byte temporary besides: 1.5x the body at the last doubling)."""
    while len(body) < size:
        body += memoryview(_ZEROS)[: size - len(body)]


def _malformed_head(lines: list[bytes]) -> ApiError | None:
    """Why a request line and headers cannot be parsed as HTTP/1.x; ``None`` when they can. http.server
    takes a two-word request line for HTTP/0.9 and reads a header line without a colon as the body's start."""
    request_line = lines[0].rstrip(b"\r\n")
    shown = request_line[:80].decode("latin-1")
    words = request_line.split()
    if len(words) != 3 or not words[2].startswith(b"HTTP/"):
        return ApiError(HTTPStatus.BAD_REQUEST, "bad_request_line",
                         f"malformed request line {shown!r}: expected 3 words, METHOD /path HTTP/1.1",
                         hint="HTTP/0.9 and request targets with spaces are not accepted; percent-encode spaces as %20")  # fmt: skip
    for line in lines[1:-1]:
        shown = line.rstrip(b"\r\n")[:80].decode("latin-1")
        if line[:1] in (b" ", b"\t"):
            return ApiError(HTTPStatus.BAD_REQUEST, "bad_header", f"header line {shown!r} is folded onto the one "
                             "before (obsolete line folding)", hint="send each header on one line")  # fmt: skip
        if not _HEADER_LINE.match(line):
            return ApiError(HTTPStatus.BAD_REQUEST, "bad_header", f"header line {shown!r} is not 'Name: value'",
                             hint="a header is a name (no spaces), a colon right after it, then its value")  # fmt: skip
    return None


def _unreadable_framing(lengths: list[str], codings: list[str]) -> ApiError | None:
    """Why a request's body cannot be delimited as this API reads bodies (one Content-Length); ``None`` when
    it can. A wrong guess would read the next request from the body, or the body as the next request."""
    if codings:
        coding = ", ".join(codings)[:80]
        if coding.rsplit(",", 1)[-1].strip().lower() == "chunked":
            return ApiError(HTTPStatus.LENGTH_REQUIRED, "length_required",
                             f"chunked transfer encoding (Transfer-Encoding: {coding}) is not supported",
                             hint="send the body whole, with a Content-Length header of its size in bytes")  # fmt: skip
        return ApiError(HTTPStatus.NOT_IMPLEMENTED, "transfer_encoding_not_implemented",
                         f"transfer coding {coding!r} is not implemented",
                         hint="send the body as it is, with a Content-Length header of its size in bytes")  # fmt: skip
    if len(lengths) > 1:
        return ApiError(HTTPStatus.BAD_REQUEST, "bad_content_length",
                         f"{len(lengths)} Content-Length headers ({', '.join(v[:20] for v in lengths[:4])}); send one",
                         hint="a request carries one Content-Length: its body's size in bytes")  # fmt: skip
    if lengths and not (lengths[0].isascii() and lengths[0].isdigit()):
        return ApiError(HTTPStatus.BAD_REQUEST, "bad_content_length",
                         f"Content-Length {lengths[0][:40]!r} is not a non-negative decimal number of bytes",
                         hint="a request carries one Content-Length: its body's size in bytes")  # fmt: skip
    if lengths and len(lengths[0].lstrip("0")) > MAX_LENGTH_DIGITS:  # (int() of 4,300 digits raises; no body is that big)
        return ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "too_large",
                         f"Content-Length of {len(lengths[0].lstrip('0'))} digits is larger than any body this API reads",
                         hint="send the body's size in bytes, within api.max_request_mb")  # fmt: skip
    return None
