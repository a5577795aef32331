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
Both are thin adapters over the serving core (:mod:`edgekit_runtime.agent.serving_core`: request ->
validated tensors -> model -> response), on one HTTP layer (:mod:`edgekit_runtime.agent.http_handler`:
framing, limits, web-page checks, bodies); this module holds ``/v1``'s endpoints and the server.

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

import json
import logging
import os
import socket
import socketserver
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from edgekit_runtime.agent import oip
from edgekit_runtime.agent.body_budget import DEFAULT_INFLIGHT_BODY_BYTES, BodyBudget
from edgekit_runtime.agent.config import ApiAddress, ApiConfig, parse_api_address
from edgekit_runtime.agent.errors import AgentApiError
from edgekit_runtime.agent.http_connections import DEFAULT_MAX_CONNECTIONS, ConnectionTracking
from edgekit_runtime.agent.http_guard import HostPolicy, Refusal, content_type_refusal, media_type
from edgekit_runtime.agent.http_handler import ApiError, RequestHandler
from edgekit_runtime.agent.http_loop import InferLoop
from edgekit_runtime.agent.serving import InferenceServer
from edgekit_runtime.agent.serving_core import ServingError, parse_json_request, run_model, timing_headers
from edgekit_runtime.agent.wire import (
    BINARY_CONTENT_TYPE,
    JSON_CONTENT_TYPE,
    decode_binary,
    decode_json_tensors,
    encode_binary,
    encode_json_tensors,
)
from edgekit_runtime.errors import InputSignatureError

logger = logging.getLogger(__name__)

HealthProvider = Callable[[], dict[str, Any]]
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
#: a kept-alive connection with no request for this long is closed (its thread ends)
DEFAULT_IDLE_TIMEOUT_S = 60.0
DEFAULT_MAX_HEADER_BYTES = 16 * 1024
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 60.0


# -- endpoints --------------------------------------------------------------------------------------------


def _infer(handler: RequestHandler) -> None:
    api = handler.api
    refusal = content_type_refusal(handler.headers.get("Content-Type"), (JSON_CONTENT_TYPE, BINARY_CONTENT_TYPE))
    if refusal is not None:
        raise ApiError.from_refusal(refusal)
    content_type = media_type(handler.headers.get("Content-Type")) or JSON_CONTENT_TYPE
    if api.server.signature is None:  # refused before the body is read
        raise ApiError(HTTPStatus.SERVICE_UNAVAILABLE, "no_model", "no bundle is loaded, so there is no model to run",
                        hint="deploy a bundle (edgekit-agent install, or a deploy command from the fleet)")  # fmt: skip
    body = handler.read_body(api.server)
    accept = media_type(handler.headers.get("Accept"))
    reply_type = accept if accept in (JSON_CONTENT_TYPE, BINARY_CONTENT_TYPE) else content_type
    signature = api.server.signature
    try:
        feeds = _decode_request(body, content_type, signature, api.server.model_name)
        result = run_model(api.server, feeds)
    except InputSignatureError as err:
        raise _signature_error(err.message, err.hint, signature) from err
    except ServingError as err:
        if err.kind == "input_signature":
            raise _signature_error(err.message, err.hint, signature) from err
        raise ApiError(err.status, err.kind, err.message, err.hint) from err
    headers = {**timing_headers(result), "X-Edgekit-Model": api.server.model_name or ""}
    if reply_type == BINARY_CONTENT_TYPE:
        handler._send(HTTPStatus.OK, encode_binary(result.outputs), BINARY_CONTENT_TYPE, headers)
    else:
        payload = {"model": api.server.model_name, "outputs": encode_json_tensors(result.outputs), "timing": result.timing.to_dict()}
        handler._send_json(HTTPStatus.OK, payload, headers)


def _signature_error(message: str, hint: str | None, signature: Any) -> ApiError:
    """400 ``input_signature``, with the signature the model expects."""
    return ApiError(HTTPStatus.BAD_REQUEST, "input_signature", message, hint,
                    signature=None if signature is None else signature.to_dict())  # fmt: skip


def _decode_request(body: bytearray, content_type: str, signature: Any, model: str | None) -> dict[str, Any]:
    """The request's tensors; whatever is wrong with the body is an :class:`InputSignatureError` (a 400).
    A JSON body's values and arrays are counted against the model's inputs first, then parsed with its large
    arrays of numbers read straight into numpy (:mod:`~edgekit_runtime.agent.json_tensors`), and the body's
    buffer is emptied once parsed."""
    try:
        if content_type == BINARY_CONTENT_TYPE:
            return decode_binary(body)
        try:
            payload = parse_json_request(body, signature, str(model))  # counted, then large arrays straight to numpy
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


def _health(handler: RequestHandler) -> None:
    api = handler.api
    payload = api.health_provider() if api.health_provider else {}
    payload.setdefault("status", "ok" if api.server.model_name is not None else "no_model")
    payload.setdefault("model", api.server.model_name)
    status = HTTPStatus.OK if payload["status"] == "ok" else HTTPStatus.SERVICE_UNAVAILABLE
    handler._send_json(status, payload)


def _stats(handler: RequestHandler) -> None:
    server = handler.api.server
    totals = server.totals()
    handler._send_json(
        HTTPStatus.OK,
        {"window": server.current_window().to_dict(), "totals": totals.__dict__, "batching": server.batching_active},
    )


def _signature(handler: RequestHandler) -> None:
    server = handler.api.server
    signature = server.signature
    if signature is None:
        raise ApiError(HTTPStatus.SERVICE_UNAVAILABLE, "no_model", "no bundle is loaded")
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

    get_routes: dict[str, Callable[[RequestHandler], None]] = {"/v1/health": _health, "/v1/stats": _stats, "/v1/signature": _signature}
    post_routes: dict[str, Callable[[RequestHandler], None]] = {"/v1/infer": _infer}
    #: every path under ``/v2``: the Open Inference Protocol
    v2_handler: Callable[[RequestHandler, str], None] = staticmethod(oip.handle)

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
        event_loop: bool = True,
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
        #: kept-alive OIP inference connections move to one event loop (:mod:`~edgekit_runtime.agent.http_loop`)
        self.event_loop = event_loop
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
    def loop_connections(self) -> int:
        """Kept-alive inference connections served by the event loop now (:mod:`~edgekit_runtime.agent.http_loop`)."""
        loop = None if self._httpd is None else self._httpd.infer_loop
        return 0 if loop is None else loop.connections

    @property
    def loop_held_bytes(self) -> int:
        """Bytes the event loop holds now: requests read and not yet served, and replies not yet sent."""
        loop = None if self._httpd is None else self._httpd.infer_loop
        return 0 if loop is None else loop.held_bytes

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
            (RequestHandler,),
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
        if self.event_loop:
            httpd.infer_loop = InferLoop(self, httpd).start()
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
        loop, self._httpd.infer_loop = self._httpd.infer_loop, None
        if loop is not None:
            loop.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.address.unix_path is not None:
            Path(self.address.unix_path).unlink(missing_ok=True)
        self._httpd = None

    def __enter__(self) -> AgentApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
