"""The agent's local HTTP API, on a loopback address or a Unix socket only (it has no authentication).

=======  ===============  ===========================================================================
method   path             what
=======  ===============  ===========================================================================
POST     ``/v1/infer``    run the model; body JSON or ``application/x-edgekit-tensors``
                          (:mod:`edgekit_runtime.agent.wire`); the reply uses the encoding named in
                          ``Accept``, else the request's; timing in ``X-Edgekit-Queue-Ms`` and
                          ``X-Edgekit-Compute-Ms`` headers (and ``timing`` in JSON replies)
GET      ``/v1/health``   ``{"status": "ok" | "no_model" | ..., "model": ..., ...}``
GET      ``/v1/stats``    the open statistics window and the counters since start
GET      ``/v1/signature`` the served model's inputs, outputs and dim bounds
=======  ===============  ===========================================================================

Every path under ``/v2`` is the Open Inference Protocol (KServe v2) for every model of the repository
(:mod:`edgekit_runtime.agent.oip`, with its own ``{"error": ...}`` objects); ``/v1`` serves the default model.

Errors are JSON ``{"error": kind, "message": ..., "hint": ...}``: 400 for a malformed request or inputs
that do not match the signature (with the expected ``signature``), 408 for a client too slow to send
its request, 413 for a body over the limit, 431 for headers over the limit, 503 without a model or
with every connection slot taken, 500 when the model fails to run.

A request is checked before any endpoint sees it, and refused (the connection then closed, since its
framing cannot be trusted) in that same format, or the Open Inference Protocol's under ``/v2``: 400
for a request line that is not ``METHOD /path HTTP/1.x`` (HTTP/0.9's ``GET /`` included), a header
line without a colon, an obsolete folded header, or a Content-Length that is not one non-negative
decimal number; 411 for a chunked body (send its Content-Length), 501 for another transfer coding or
a method other than GET and POST, 505 for HTTP/2 and later.

Replies are valid JSON: a NaN or infinite output value is written as the string ``"NaN"``,
``"Infinity"`` or ``"-Infinity"`` (what ``float()``, numpy's ``np.array(data, dtype=...)`` and
JavaScript's ``Number()`` read back exactly; Triton's bare ``NaN`` tokens are not JSON), and the reply
carries ``X-Edgekit-Non-Finite: <count>``. The binary encoding carries such values as they are.

Against web pages (:mod:`edgekit_runtime.agent.http_guard`; not over a Unix socket, which no page can
reach): a ``Host`` that is not a loopback name or address nor in ``api.allowed_hosts`` is refused with
421 ``unknown_host`` (DNS rebinding), an ``Origin`` from another host with 403 ``forbidden_origin``, and an
inference body sent as ``text/plain``, a form or multipart with 415 ``unsupported_media_type``.

Connections are HTTP/1.1 keep-alive, one thread each, at most ``max_connections`` at a time. Past it a
new connection takes the slot of the longest-waiting connection (no whole request for a second or more)
of the client holding the most, which is closed with 503 ``evicted``; with every slot busy serving, the
new connection gets a 503 ``busy`` and is closed (:mod:`edgekit_runtime.agent.http_connections`).
Limits against slow or greedy clients, all enforced on the bytes that arrive (nothing is allocated
from what a header claims):

* a kept-alive connection with no request for ``idle_timeout_s`` is closed;
* the request line and headers must arrive within ``header_timeout_s`` of their first byte and fit in
  ``max_header_bytes`` (else 408 / 431);
* the bodies of all requests in progress together may hold at most ``max_inflight_body_bytes``
  (:mod:`edgekit_runtime.agent.body_budget`): a body that does not fit beside them is refused (503
  ``busy_bodies`` with ``Retry-After``) from its ``Content-Length``, one larger than the whole budget 413;
* a body over ``max_request_bytes``, or larger than the served model's inputs can need (every dim at its
  bound, 32 bytes a value, plus 64 KiB), is refused (413) from its ``Content-Length`` before a byte of
  it is read; a JSON body holding more commas or ``[`` than the model has input values is refused (400)
  before it is parsed, and its arrays of numbers are parsed straight into numpy arrays
  (:mod:`edgekit_runtime.agent.json_tensors`); a body is read as it arrives, into a buffer that grows with it, and must arrive within
  ``body_timeout_s`` (else 408); a reply must be taken within ``body_timeout_s`` too.

``stop()`` closes every connection; each reply leaves in one write.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import re
import socket
import socketserver
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from edgekit_runtime.agent.body_budget import DEFAULT_INFLIGHT_BODY_BYTES, RETRY_AFTER_S, BodyBudget
from edgekit_runtime.agent.config import ApiAddress, ApiConfig, parse_api_address
from edgekit_runtime.agent.errors import AgentApiError, NoModelError
from edgekit_runtime.agent.http_connections import DEFAULT_MAX_CONNECTIONS, ConnectionTracking
from edgekit_runtime.agent.http_guard import (
    HostPolicy,
    Refusal,
    body_limit_refusal,
    check_json_item_counts,
    content_type_refusal,
    media_type,
)
from edgekit_runtime.agent.json_tensors import loads_tensor_json
from edgekit_runtime.agent.serving import InferenceServer
from edgekit_runtime.agent.wire import (
    BINARY_CONTENT_TYPE,
    JSON_CONTENT_TYPE,
    decode_binary,
    decode_json_tensors,
    encode_binary,
    encode_json_tensors,
)
from edgekit_runtime.errors import EdgekitError, InputSignatureError

logger = logging.getLogger(__name__)

HealthProvider = Callable[[], dict[str, Any]]
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
#: a kept-alive connection with no request for this long is closed (its thread ends)
DEFAULT_IDLE_TIMEOUT_S = 60.0
DEFAULT_MAX_HEADER_BYTES = 16 * 1024
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 60.0
#: a body's buffer starts at most this big and doubles as bytes arrive (never sized from Content-Length)
_FIRST_BODY_BUFFER_BYTES = 64 * 1024
_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}
#: a header line: a token (RFC 9110 5.6.2), then a colon with no whitespace before it
_HEADER_LINE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:")
_METHODS = ("GET", "POST")
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


class _ApiError(Exception):
    def __init__(self, status: HTTPStatus, kind: str, message: str, hint: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.hint, self.extra = status, kind, message, hint, extra
        #: headers the answer carries (``Retry-After`` for a body refused for the in-flight budget)
        self.headers: dict[str, str] = {}

    @classmethod
    def from_refusal(cls, refusal: Refusal) -> _ApiError:
        return cls(refusal.status, refusal.kind, refusal.message, refusal.hint)


class _Handler(BaseHTTPRequestHandler):
    server_version = "edgekit-agent"
    protocol_version = "HTTP/1.1"
    api: AgentApi  # set on the per-server subclass, with ``timeout`` (the idle timeout)
    _requests_started = 0  # per connection (set on the instance)
    _reserved_body_bytes = 0  # this request's share of the API's body budget (set on the instance)
    #: buffered, so that a reply's status line, headers and body leave in one write (http.server flushes
    #: after each request); a body larger than this goes out in a write of its own
    wbufsize = 64 * 1024

    # -- plumbing -------------------------------------------------------------------------------------

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
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, status: HTTPStatus, payload: Any, headers: dict[str, str] | None = None) -> None:
        try:
            body = json.dumps(payload, allow_nan=False).encode("utf-8")
        except ValueError:  # NaN or an infinity somewhere: spelled as strings, counted in a header
            counter = [0]
            body = json.dumps(_finite_json(payload, counter), allow_nan=False).encode("utf-8")
            headers = {**(headers or {}), "X-Edgekit-Non-Finite": str(counter[0])}
        self._send(status, body, JSON_CONTENT_TYPE, headers)

    def _send_error(self, err: _ApiError) -> None:
        payload = {"error": err.kind, "message": err.message, "hint": err.hint, **err.extra}
        self._send_json(err.status, payload, err.headers or None)

    def _refuse(self, err: _ApiError) -> None:
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
        self._refuse(_ApiError(status, _REFUSAL_KINDS.get(status, "bad_request"), message or status.phrase,
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
            if not self._read_request_head():
                self.close_connection = True
                return
            server.mark_serving(self.connection)  # type: ignore[attr-defined]
            refusal = self.api.browser_refusal(self.headers)
            if refusal is not None:
                logger.info("API: refused %s %s from %s: %d %s (%s)", self.command, self.path[:80], self.address_string(),
                            refusal.status.value, refusal.kind, refusal.message)  # fmt: skip
                self._refuse(_ApiError.from_refusal(refusal))
                return
            if self.command not in _METHODS:
                self._refuse(_ApiError(HTTPStatus.NOT_IMPLEMENTED, "method_not_implemented",
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
                self._send_error(_ApiError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "headers_too_large",
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
        socket_file, self.rfile = self.rfile, io.BytesIO(b"".join(lines[1:]))
        try:
            if not self.parse_request():  # answers 400 / 431 / 505 itself (send_error) when it returns False
                return False
        finally:
            self.rfile = socket_file
        problem = _unreadable_framing(self.headers.get_all("Content-Length") or [],
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
                    raise _ApiError(HTTPStatus.METHOD_NOT_ALLOWED, "method_not_allowed", f"{self.command} is not allowed on {path}")
                raise _ApiError(HTTPStatus.NOT_FOUND, "not_found", f"no endpoint {path}", hint=f"endpoints: {', '.join(known)}")
            handler()
        except _ApiError as err:
            self._drain_body()
            self._send_error(err)
        except Exception:  # a bug: answer 500 rather than dropping the connection
            logger.exception("API handler for %s %s failed", self.command, path)
            self._send_error(_ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, "internal", "internal error in the agent; see its log"))

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
        """The Open Inference Protocol (:mod:`edgekit_runtime.agent.oip`), with its own error objects."""
        from edgekit_runtime.agent import oip

        try:
            oip.handle(self, self.command)
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
        if length_text is None or not length_text.isdigit() or not length_text.isascii():
            raise _ApiError(HTTPStatus.LENGTH_REQUIRED, "length_required", "send a Content-Length header with the body's size in bytes")
        length = int(length_text)
        if length > self.api.max_request_bytes:
            raise _ApiError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                "too_large",
                f"request body of {length} bytes is over the limit of {self.api.max_request_bytes}",
                hint="split the batch, or raise api.max_request_mb in the agent config",
            )
        signature = None if server is None else server.signature
        if signature is not None:
            refusal = body_limit_refusal(length, signature, model or str(server.model_name), setting="api.max_request_mb")  # type: ignore[union-attr]
            if refusal is not None:
                raise _ApiError.from_refusal(refusal)
        refusal = self.api.body_budget.reserve(length)
        if refusal is not None:
            logger.info("API: refused a body of %d bytes from %s: %s", length, self.address_string(), refusal.message)
            err = _ApiError.from_refusal(refusal)
            if refusal.status == HTTPStatus.SERVICE_UNAVAILABLE:  # it fits once others are answered
                err.headers["Retry-After"] = str(RETRY_AFTER_S)
            raise err
        self._reserved_body_bytes = length
        self.server.set_deadline(self.connection, self.api.body_timeout_s, "body")  # type: ignore[attr-defined]
        body = bytearray(min(length, _FIRST_BODY_BUFFER_BYTES))
        received = 0
        while received < length:
            if received == len(body):
                _grow(body, min(2 * len(body), length))
            count = self.rfile.readinto1(memoryview(body)[received:])
            if not count:
                raise _ApiError(HTTPStatus.BAD_REQUEST, "truncated", f"body ended after {received} of {length} bytes")
            received += count
        self._body_read = True
        self.server.clear_deadline(self.connection)  # type: ignore[attr-defined]  # inference has no deadline
        return body


_ZEROS = bytes(1024 * 1024)


def _grow(body: bytearray, size: int) -> None:
    """Extend ``body`` with zeros to ``size`` bytes, a megabyte at a time (``extend(bytes(n))`` would hold an
    ``n``-byte temporary besides: 1.5x the body at the last doubling)."""
    while len(body) < size:
        body += memoryview(_ZEROS)[: size - len(body)]


def _malformed_head(lines: list[bytes]) -> _ApiError | None:
    """Why a request line and headers cannot be parsed as HTTP/1.x; ``None`` when they can. http.server
    takes a two-word request line for HTTP/0.9 and reads a header line without a colon as the body's start."""
    request_line = lines[0].rstrip(b"\r\n")
    shown = request_line[:80].decode("latin-1")
    words = request_line.split()
    if len(words) != 3 or not words[2].startswith(b"HTTP/"):
        return _ApiError(HTTPStatus.BAD_REQUEST, "bad_request_line",
                         f"malformed request line {shown!r}: expected 3 words, METHOD /path HTTP/1.1",
                         hint="HTTP/0.9 and request targets with spaces are not accepted; percent-encode spaces as %20")  # fmt: skip
    for line in lines[1:-1]:
        shown = line.rstrip(b"\r\n")[:80].decode("latin-1")
        if line[:1] in (b" ", b"\t"):
            return _ApiError(HTTPStatus.BAD_REQUEST, "bad_header", f"header line {shown!r} is folded onto the one "
                             "before (obsolete line folding)", hint="send each header on one line")  # fmt: skip
        if not _HEADER_LINE.match(line):
            return _ApiError(HTTPStatus.BAD_REQUEST, "bad_header", f"header line {shown!r} is not 'Name: value'",
                             hint="a header is a name (no spaces), a colon right after it, then its value")  # fmt: skip
    return None


def _unreadable_framing(lengths: list[str], codings: list[str]) -> _ApiError | None:
    """Why a request's body cannot be delimited as this API reads bodies (one Content-Length); ``None`` when
    it can. A wrong guess would read the next request from the body, or the body as the next request."""
    if codings:
        coding = ", ".join(codings)[:80]
        if coding.rsplit(",", 1)[-1].strip().lower() == "chunked":
            return _ApiError(HTTPStatus.LENGTH_REQUIRED, "length_required",
                             f"chunked transfer encoding (Transfer-Encoding: {coding}) is not supported",
                             hint="send the body whole, with a Content-Length header of its size in bytes")  # fmt: skip
        return _ApiError(HTTPStatus.NOT_IMPLEMENTED, "transfer_encoding_not_implemented",
                         f"transfer coding {coding!r} is not implemented",
                         hint="send the body as it is, with a Content-Length header of its size in bytes")  # fmt: skip
    if len(lengths) > 1:
        return _ApiError(HTTPStatus.BAD_REQUEST, "bad_content_length",
                         f"{len(lengths)} Content-Length headers ({', '.join(v[:20] for v in lengths[:4])}); send one",
                         hint="a request carries one Content-Length: its body's size in bytes")  # fmt: skip
    if lengths and not (lengths[0].isascii() and lengths[0].isdigit()):
        return _ApiError(HTTPStatus.BAD_REQUEST, "bad_content_length",
                         f"Content-Length {lengths[0][:40]!r} is not a non-negative decimal number of bytes",
                         hint="a request carries one Content-Length: its body's size in bytes")  # fmt: skip
    return None


# -- endpoints --------------------------------------------------------------------------------------------


def _infer(handler: _Handler) -> None:
    api = handler.api
    refusal = content_type_refusal(handler.headers.get("Content-Type"), (JSON_CONTENT_TYPE, BINARY_CONTENT_TYPE))
    if refusal is not None:
        raise _ApiError.from_refusal(refusal)
    content_type = media_type(handler.headers.get("Content-Type")) or JSON_CONTENT_TYPE
    if api.server.signature is None:  # refused before the body is read
        raise _ApiError(HTTPStatus.SERVICE_UNAVAILABLE, "no_model", "no bundle is loaded, so there is no model to run",
                        hint="deploy a bundle (edgekit-agent install, or a deploy command from the fleet)")  # fmt: skip
    body = handler.read_body(api.server)
    accept = media_type(handler.headers.get("Accept"))
    reply_type = accept if accept in (JSON_CONTENT_TYPE, BINARY_CONTENT_TYPE) else content_type
    signature = api.server.signature
    try:
        feeds = _decode_request(body, content_type, signature, api.server.model_name)
        result = api.server.infer(feeds)
    except InputSignatureError as err:
        raise _ApiError(
            HTTPStatus.BAD_REQUEST, "input_signature", err.message, err.hint,
            signature=None if signature is None else signature.to_dict(),
        ) from err  # fmt: skip
    except NoModelError as err:
        raise _ApiError(HTTPStatus.SERVICE_UNAVAILABLE, "no_model", err.message, err.hint) from err
    except EdgekitError as err:
        raise _ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, "inference_failed", err.message, err.hint) from err
    timing = result.timing
    headers = {"X-Edgekit-Queue-Ms": f"{timing.queue_ms:.4f}", "X-Edgekit-Compute-Ms": f"{timing.compute_ms:.4f}",
               "X-Edgekit-Model": api.server.model_name or ""}  # fmt: skip
    if reply_type == BINARY_CONTENT_TYPE:
        handler._send(HTTPStatus.OK, encode_binary(result.outputs), BINARY_CONTENT_TYPE, headers)
    else:
        payload = {"model": api.server.model_name, "outputs": encode_json_tensors(result.outputs), "timing": timing.to_dict()}
        handler._send_json(HTTPStatus.OK, payload, headers)


def _decode_request(body: bytearray, content_type: str, signature: Any, model: str | None) -> dict[str, Any]:
    """The request's tensors; whatever is wrong with the body is an :class:`InputSignatureError` (a 400).
    A JSON body's values and arrays are counted against the model's inputs first, then parsed with its large
    arrays of numbers read straight into numpy (:mod:`~edgekit_runtime.agent.json_tensors`), and the body's
    buffer is emptied once parsed."""
    try:
        if content_type == BINARY_CONTENT_TYPE:
            return decode_binary(body)
        refusal = None if signature is None else check_json_item_counts(body, signature, str(model))
        if refusal is not None:
            raise InputSignatureError(refusal.message, hint=refusal.hint)
        try:
            payload = loads_tensor_json(body)  # large arrays of numbers straight to numpy
            body.clear()
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise InputSignatureError(f"request body is not valid JSON: {err}", hint='send {"inputs": {...}}') from err
        except RecursionError as err:
            raise InputSignatureError("request body nests JSON arrays or objects too deeply to parse",
                                      hint='send {"inputs": {"NAME": {"dtype", "shape", "data"}}} with data nested once per dim') from err  # fmt: skip
        return decode_json_tensors(payload.get("inputs") if isinstance(payload, dict) else None)
    except InputSignatureError:
        raise
    except (ValueError, TypeError, OverflowError, MemoryError, RecursionError) as err:
        # numpy's own complaint about a shape or nesting it cannot build (e.g. a dim of 1e30)
        raise InputSignatureError(f"malformed {content_type} request: {type(err).__name__}: {err}",
                                  hint="check every tensor's dtype, shape (integers >= 0) and data nesting") from err  # fmt: skip


def _health(handler: _Handler) -> None:
    api = handler.api
    payload = api.health_provider() if api.health_provider else {}
    payload.setdefault("status", "ok" if api.server.model_name is not None else "no_model")
    payload.setdefault("model", api.server.model_name)
    status = HTTPStatus.OK if payload["status"] == "ok" else HTTPStatus.SERVICE_UNAVAILABLE
    handler._send_json(status, payload)


def _stats(handler: _Handler) -> None:
    server = handler.api.server
    totals = server.totals()
    handler._send_json(
        HTTPStatus.OK,
        {"window": server.current_window().to_dict(), "totals": totals.__dict__, "batching": server.batching_active},
    )


def _signature(handler: _Handler) -> None:
    server = handler.api.server
    signature = server.signature
    if signature is None:
        raise _ApiError(HTTPStatus.SERVICE_UNAVAILABLE, "no_model", "no bundle is loaded")
    handler._send_json(HTTPStatus.OK, {"model": server.model_name, **signature.to_dict()})


# -- the server -------------------------------------------------------------------------------------------


class _TcpHTTPServer(ConnectionTracking, ThreadingHTTPServer):
    pass


class _Tcp6HTTPServer(_TcpHTTPServer):
    address_family = socket.AF_INET6


class _UnixHTTPServer(ConnectionTracking, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self) -> tuple[socket.socket, Any]:
        request, _ = super().get_request()
        return request, ("unix", 0)


class AgentApi:
    """Serves models over HTTP: ``/v1`` (the default model) and the Open Inference Protocol under ``/v2``
    (every model, :mod:`edgekit_runtime.agent.oip`). ``models`` is the agent's
    :class:`~edgekit_runtime.agent.repository.ModelRepository`, or one :class:`InferenceServer` (or a list
    of them) built by the caller. ``start()`` binds and serves in a daemon thread."""

    get_routes: dict[str, Callable[[_Handler], None]] = {"/v1/health": _health, "/v1/stats": _stats, "/v1/signature": _signature}
    post_routes: dict[str, Callable[[_Handler], None]] = {"/v1/infer": _infer}

    def __init__(
        self,
        models: Any,
        address: str | ApiAddress,
        *,
        health_provider: HealthProvider | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
        allowed_hosts: tuple[str, ...] = (),
        max_inflight_body_bytes: int = DEFAULT_INFLIGHT_BODY_BYTES,
    ) -> None:
        if isinstance(models, (InferenceServer, list, tuple)):
            from edgekit_runtime.agent.repository import StaticModels

            models = StaticModels(models)
        self.models = models
        # Re-checked here, so that code that builds the API directly cannot bind to the network either.
        self.address = address if isinstance(address, ApiAddress) else parse_api_address(address)
        if not self.address.is_unix:
            parse_api_address(str(self.address))
        self.health_provider = health_provider
        self.max_request_bytes = max_request_bytes
        self.idle_timeout_s = idle_timeout_s
        self.max_header_bytes = max_header_bytes
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        #: the request bodies all connections hold at once (``api.max_inflight_body_mb``)
        self.body_budget = BodyBudget(max_inflight_body_bytes)
        #: Host and Origin checks against pages in a browser (none over a Unix socket, which no page can reach)
        self.host_policy = None if self.address.is_unix else HostPolicy(allowed_hosts, bound_host=self.address.host,
                                                                        setting="api.allowed_hosts")  # fmt: skip
        self._httpd: _UnixHTTPServer | _TcpHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def server(self) -> InferenceServer:
        """The default model's server: what ``/v1`` serves."""
        return self.models.default.server

    @property
    def bound_address(self) -> str:
        """The address clients should use (with the real port when 0 was asked for)."""
        if self._httpd is None:
            raise AgentApiError("the API is not started", hint="call start() first")
        if self.address.is_unix:
            return str(self.address)
        host, port = self._httpd.server_address[:2]  # type: ignore[attr-defined]
        return str(ApiAddress(host=str(host), port=int(port)))

    @classmethod
    def from_config(cls, server: Any, config: ApiConfig, *, health_provider: HealthProvider | None = None) -> AgentApi:
        """The API as the agent config's ``api`` section describes it."""
        return cls(server, config.address, health_provider=health_provider, max_request_bytes=config.max_request_bytes,
                   idle_timeout_s=config.idle_timeout_s, max_header_bytes=config.max_header_bytes,
                   max_connections=config.max_connections, header_timeout_s=config.header_timeout_s,
                   body_timeout_s=config.body_timeout_s, allowed_hosts=config.allowed_hosts,
                   max_inflight_body_bytes=config.max_inflight_body_bytes)  # fmt: skip

    def browser_refusal(self, headers: Any) -> Refusal | None:
        """Why a request must be refused as coming from a web page (an unknown ``Host``: DNS rebinding; a
        foreign ``Origin``); None for requests from programs and from loopback pages."""
        if self.host_policy is None:
            return None
        return self.host_policy.host_refusal(headers.get("Host")) or self.host_policy.origin_refusal(headers.get("Origin"))

    @property
    def evicted_connections(self) -> int:
        """Connections closed, waiting without a whole request, to give their slot to a new connection."""
        return 0 if self._httpd is None else self._httpd.evicted_connections

    @property
    def open_connections(self) -> int:
        """Client connections open now (kept alive between requests)."""
        return 0 if self._httpd is None else self._httpd.open_connections

    @property
    def refused_connections(self) -> int:
        """Connections refused (503) because ``max_connections`` were open."""
        return 0 if self._httpd is None else self._httpd.refused_connections

    @property
    def timed_out_connections(self) -> int:
        """Connections closed for sending their headers or body, or taking their reply, too slowly."""
        return 0 if self._httpd is None else self._httpd.timed_out_connections

    def start(self) -> AgentApi:
        # Nagle off on TCP, so that a reply does not wait for the client's delayed ACK (no such option on Unix sockets).
        handler = type(
            "AgentApiHandler",
            (_Handler,),
            {"api": self, "timeout": self.idle_timeout_s, "disable_nagle_algorithm": not self.address.is_unix},
        )
        try:
            if self.address.unix_path is not None:
                path = self.address.unix_path
                path.parent.mkdir(parents=True, exist_ok=True)
                if path.is_socket():
                    path.unlink()  # a stale socket from a previous run
                httpd: _UnixHTTPServer | _TcpHTTPServer = _UnixHTTPServer(str(path), handler)
                os.chmod(path, 0o660)
            else:
                server_class = _Tcp6HTTPServer if ":" in (self.address.host or "") else _TcpHTTPServer
                httpd = server_class((self.address.host, self.address.port), handler)
        except OSError as err:
            raise AgentApiError(
                f"cannot listen on {self.address}: {err.strerror or err}",
                hint="another process (an agent already running?) holds the address, or the socket's "
                "directory is not writable; change api.address",
            ) from err
        httpd.max_connections = self.max_connections
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2}, name="edgekit-api", daemon=True)
        self._thread.start()
        logger.info("local API listening on %s", self.bound_address)
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd.close_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.address.unix_path is not None:
            Path(self.address.unix_path).unlink(missing_ok=True)
        self._httpd = None

    def __enter__(self) -> AgentApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
