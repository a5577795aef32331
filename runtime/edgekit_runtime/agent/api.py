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

Errors are JSON ``{"error": kind, "message": ..., "hint": ...}``: 400 for inputs that do not match the
signature (with the expected ``signature``), 413 for a body over the limit, 503 without a model,
500 when the model fails to run.

Connections are HTTP/1.1 keep-alive (one thread each, closed after ``idle_timeout_s`` without a request,
and all closed by ``stop()``); each reply leaves in one write.
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from edgekit_runtime.agent.config import ApiAddress, parse_api_address
from edgekit_runtime.agent.errors import AgentApiError, NoModelError
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


class _ApiError(Exception):
    def __init__(self, status: HTTPStatus, kind: str, message: str, hint: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.hint, self.extra = status, kind, message, hint, extra


class _Handler(BaseHTTPRequestHandler):
    server_version = "edgekit-agent"
    protocol_version = "HTTP/1.1"
    api: AgentApi  # set on the per-server subclass, with ``timeout`` (the idle timeout)
    #: buffered, so that a reply's status line, headers and body leave in one write (http.server flushes
    #: after each request); a body larger than this goes out in a write of its own
    wbufsize = 64 * 1024

    # -- plumbing -------------------------------------------------------------------------------------

    def address_string(self) -> str:
        return self.client_address[0] if isinstance(self.client_address, tuple) else "unix"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        logger.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: HTTPStatus, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, status: HTTPStatus, payload: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload).encode("utf-8"), JSON_CONTENT_TYPE, headers)

    def _send_error(self, err: _ApiError) -> None:
        payload = {"error": err.kind, "message": err.message, "hint": err.hint, **err.extra}
        self._send_json(err.status, payload)

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

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._body_read = True
        self._dispatch({path: lambda fn=fn: fn(self) for path, fn in self.api.get_routes.items()})

    def do_POST(self) -> None:  # noqa: N802
        self._body_read = False
        self._dispatch({path: lambda fn=fn: fn(self) for path, fn in self.api.post_routes.items()})

    def read_body(self) -> bytearray:
        length_text = self.headers.get("Content-Length")
        if length_text is None or not length_text.isdigit():
            raise _ApiError(HTTPStatus.LENGTH_REQUIRED, "length_required", "send a Content-Length header")
        length = int(length_text)
        if length > self.api.max_request_bytes:
            raise _ApiError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                "too_large",
                f"request body of {length} bytes is over the limit of {self.api.max_request_bytes}",
                hint="split the batch, or raise api.max_request_mb in the agent config",
            )
        body = bytearray(length)
        view = memoryview(body)
        received = 0
        while received < length:
            count = self.rfile.readinto(view[received:])
            if not count:
                raise _ApiError(HTTPStatus.BAD_REQUEST, "truncated", f"body ended after {received} of {length} bytes")
            received += count
        self._body_read = True
        return body


# -- endpoints --------------------------------------------------------------------------------------------


def _media_type(header: str | None) -> str:
    return (header or "").split(";", 1)[0].strip().lower()


def _infer(handler: _Handler) -> None:
    api = handler.api
    content_type = _media_type(handler.headers.get("Content-Type")) or JSON_CONTENT_TYPE
    if content_type not in (JSON_CONTENT_TYPE, BINARY_CONTENT_TYPE):
        raise _ApiError(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type",
            f"Content-Type {content_type!r} is not supported", hint=f"send {JSON_CONTENT_TYPE} or {BINARY_CONTENT_TYPE}",
        )  # fmt: skip
    body = handler.read_body()
    accept = _media_type(handler.headers.get("Accept"))
    reply_type = accept if accept in (JSON_CONTENT_TYPE, BINARY_CONTENT_TYPE) else content_type
    signature = api.server.signature
    try:
        if content_type == BINARY_CONTENT_TYPE:
            feeds = decode_binary(body)
        else:
            try:
                payload = json.loads(body.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                raise InputSignatureError(f"request body is not valid JSON: {err}", hint='send {"inputs": {...}}') from err
            feeds = decode_json_tensors(payload.get("inputs") if isinstance(payload, dict) else None)
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


class _ConnectionTracking:
    """Keeps the open connections of a threading server, so that ``close_connections()`` can end the
    kept-alive ones (whose threads would otherwise go on serving after ``shutdown()``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def get_request(self) -> tuple[socket.socket, Any]:
        request, client_address = super().get_request()  # type: ignore[misc]
        with self._connections_lock:
            self._connections.add(request)
        return request, client_address

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
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


class _TcpHTTPServer(_ConnectionTracking, ThreadingHTTPServer):
    pass


class _Tcp6HTTPServer(_TcpHTTPServer):
    address_family = socket.AF_INET6


class _UnixHTTPServer(_ConnectionTracking, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self) -> tuple[socket.socket, Any]:
        request, _ = super().get_request()
        return request, ("unix", 0)


class AgentApi:
    """Serves :class:`InferenceServer` over HTTP. ``start()`` binds and serves in a daemon thread."""

    get_routes: dict[str, Callable[[_Handler], None]] = {"/v1/health": _health, "/v1/stats": _stats, "/v1/signature": _signature}
    post_routes: dict[str, Callable[[_Handler], None]] = {"/v1/infer": _infer}

    def __init__(
        self,
        server: InferenceServer,
        address: str | ApiAddress,
        *,
        health_provider: HealthProvider | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    ) -> None:
        self.server = server
        # Re-checked here, so that code that builds the API directly cannot bind to the network either.
        self.address = address if isinstance(address, ApiAddress) else parse_api_address(address)
        if not self.address.is_unix:
            parse_api_address(str(self.address))
        self.health_provider = health_provider
        self.max_request_bytes = max_request_bytes
        self.idle_timeout_s = idle_timeout_s
        self._httpd: _UnixHTTPServer | _TcpHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def bound_address(self) -> str:
        """The address clients should use (with the real port when 0 was asked for)."""
        if self._httpd is None:
            raise AgentApiError("the API is not started", hint="call start() first")
        if self.address.is_unix:
            return str(self.address)
        host, port = self._httpd.server_address[:2]  # type: ignore[attr-defined]
        return str(ApiAddress(host=str(host), port=int(port)))

    @property
    def open_connections(self) -> int:
        """Client connections open now (kept alive between requests)."""
        return 0 if self._httpd is None else self._httpd.open_connections

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
