"""A client for the agent's local API (:mod:`edgekit_runtime.agent.api`), for applications on the device.

::

    client = AgentClient("127.0.0.1:8470")          # or "unix:/run/edgekit/agent.sock"
    logits = client.infer({"image": batch})["logits"]

One client may be shared between threads: each thread keeps its own keep-alive connection, opened on
its first call and opened again when the agent has closed it (after an idle minute, or a restart).
``close()`` (or ``with AgentClient(...) as client:``) closes them all.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgekit_runtime.agent.config import ApiAddress, parse_api_address
from edgekit_runtime.agent.errors import AgentApiError, NoModelError
from edgekit_runtime.agent.wire import (
    BINARY_CONTENT_TYPE,
    JSON_CONTENT_TYPE,
    decode_binary,
    decode_json_tensors,
    encode_binary,
    encode_json_tensors,
)
from edgekit_runtime.errors import InputSignatureError

ENCODINGS = {"binary": BINARY_CONTENT_TYPE, "json": JSON_CONTENT_TYPE}
#: what a kept-alive connection the agent has closed meanwhile raises on its next request
_STALE_CONNECTION_ERRORS = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


def _evicted(answer: tuple[int, dict[str, str], bytes]) -> bool:
    """Whether ``answer`` is the agent's word that it evicted the (idle) connection it came on, not a reply."""
    status, _, body = answer
    return status == 503 and body.startswith(b"{") and b'"evicted"' in body[:200]


def _restore_non_finite(outputs: Any) -> Any:
    """Float outputs whose data spells NaN or an infinity as a string (see ``agent/api.py``) as numbers."""
    if not isinstance(outputs, dict):
        return outputs
    restored = {}
    for name, spec in outputs.items():
        if isinstance(spec, dict) and str(spec.get("dtype", "")).startswith("float") and "data" in spec:
            spec = {**spec, "data": np.array(spec["data"], dtype=np.float64)}  # float("NaN"), float("-Infinity")
        restored[name] = spec
    return restored


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._unix_path)
        self.sock = sock


class AgentClient:
    """Talks to an agent's API at ``address`` (``HOST:PORT`` on loopback, or ``unix:/PATH``)."""

    def __init__(self, address: str | ApiAddress, *, timeout_s: float = 30.0) -> None:
        self.address = address if isinstance(address, ApiAddress) else parse_api_address(address, where="AgentClient address")
        self.timeout_s = timeout_s
        #: The timing the agent reported for the last :meth:`infer` call (queue_ms, compute_ms).
        self.last_timing: dict[str, float] = {}
        self._local = threading.local()
        self._connections: list[http.client.HTTPConnection] = []
        self._connections_lock = threading.Lock()

    def _new_connection(self) -> http.client.HTTPConnection:
        connection: http.client.HTTPConnection
        if self.address.unix_path is not None:
            connection = _UnixHTTPConnection(str(self.address.unix_path), self.timeout_s)
        else:
            connection = http.client.HTTPConnection(self.address.host or "127.0.0.1", self.address.port, timeout=self.timeout_s)
        with self._connections_lock:
            self._connections.append(connection)
        self._local.connection = connection
        return connection

    def _drop_connection(self, connection: http.client.HTTPConnection) -> None:
        connection.close()
        with self._connections_lock:
            if connection in self._connections:
                self._connections.remove(connection)
        if getattr(self._local, "connection", None) is connection:
            self._local.connection = None

    def _exchange(self, connection: http.client.HTTPConnection, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()

    def _request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        headers = headers or {}
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        try:
            if connection is not None:
                try:
                    answer = self._exchange(connection, method, path, body, headers)
                    if not _evicted(answer):
                        return answer
                    # The agent evicted this idle kept-alive connection for another client (api.max_connections)
                    # and said so on it: that 503 answers no request of ours.
                    self._drop_connection(connection)
                except _STALE_CONNECTION_ERRORS:
                    # The agent closed this kept-alive connection (idle timeout, restart). Every endpoint
                    # is free of side effects, so the request goes again, once, on a new connection.
                    self._drop_connection(connection)
            connection = self._new_connection()
            return self._exchange(connection, method, path, body, headers)
        except http.client.HTTPException as err:  # a reply cut short or garbled: this connection cannot go on
            if connection is not None:
                self._drop_connection(connection)
            raise AgentApiError(
                f"the edgekit agent at {self.address} sent no complete HTTP reply to {method} {path} "
                f"({type(err).__name__}: {err}); the agent restarted, or something else answers on that address",
                hint="try again; check `edgekit-agent check --config CONFIG` and that api.address is the agent's",
            ) from err
        except OSError as err:
            if connection is not None:
                self._drop_connection(connection)
            raise AgentApiError(
                f"cannot reach the edgekit agent at {self.address}: {err.strerror or err}",
                hint="is edgekit-agent running (systemctl status edgekit-agent), and is api.address the same?",
            ) from err

    def close(self) -> None:
        """Closes every thread's connection; a later call opens a new one."""
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()
        self._local = threading.local()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _raise_for(self, status: int, body: bytes) -> None:
        try:
            payload = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            payload = None
        if not isinstance(payload, dict):
            payload = {"message": body[:200].decode("utf-8", "replace")}
        message, hint = str(payload.get("message")), payload.get("hint")
        kind = payload.get("error")
        if kind == "input_signature":
            raise InputSignatureError(message, hint=hint)
        if kind == "no_model":
            raise NoModelError(f"agent at {self.address}: {message}", hint=hint)
        raise AgentApiError(f"agent at {self.address} answered HTTP {status} ({kind}): {message}", hint=hint)

    def _get_json(self, path: str) -> dict[str, Any]:
        status, _, body = self._request("GET", path)
        if status != 200:
            self._raise_for(status, body)
        payload = self._json_object(path, body)
        if payload is None:
            raise AgentApiError(f"agent at {self.address} answered GET {path} with a body that is no JSON object: {body[:80]!r}",
                                hint="something other than the edgekit agent may answer on this address; check api.address")
        return payload

    @staticmethod
    def _json_object(path: str, body: bytes) -> dict[str, Any] | None:
        """``body`` as a JSON object, or None when it is none (cut short, garbled, another server's)."""
        try:
            payload = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None
        return payload if isinstance(payload, dict) else None

    def infer(self, feeds: Mapping[str, np.ndarray], *, encoding: str = "binary") -> dict[str, np.ndarray]:
        """Run the served model on ``feeds``; returns its outputs by name.

        ``encoding`` is ``"binary"`` (``application/x-edgekit-tensors``, the default: exact and fast)
        or ``"json"``. Inputs that do not match the model raise :class:`InputSignatureError` with the
        agent's explanation.
        """
        content_type = ENCODINGS.get(encoding)
        if content_type is None:
            raise AgentApiError(f"unknown encoding {encoding!r}", hint=f"use one of {', '.join(ENCODINGS)}")
        arrays = {name: np.asarray(value) for name, value in feeds.items()}
        if content_type == BINARY_CONTENT_TYPE:
            body = encode_binary(arrays)
        else:
            body = json.dumps({"inputs": encode_json_tensors(arrays)}).encode("utf-8")
        headers = {"Content-Type": content_type, "Accept": content_type}
        status, response_headers, response = self._request("POST", "/v1/infer", body, headers)
        if status != 200:
            self._raise_for(status, response)
        self.last_timing = {
            key: float(response_headers.get(f"x-edgekit-{key.replace('_ms', '')}-ms", "nan")) for key in ("queue_ms", "compute_ms")
        }
        if content_type == BINARY_CONTENT_TYPE:
            return decode_binary(bytearray(response))
        outputs = json.loads(response.decode("utf-8"))["outputs"]
        if "x-edgekit-non-finite" in response_headers:
            outputs = _restore_non_finite(outputs)
        return decode_json_tensors(outputs, section="outputs")

    def health(self) -> dict[str, Any]:
        """``/v1/health``; a 503 (no model, degraded) still returns the payload rather than raising."""
        status, _, body = self._request("GET", "/v1/health")
        payload = self._json_object("/v1/health", body)
        if status not in (200, 503) or payload is None or "status" not in payload:  # (busy: no health; garbled)
            if status == 200:
                raise AgentApiError(f"agent at {self.address} answered GET /v1/health with no health in it: {body[:80]!r}",
                                    hint="something other than the edgekit agent may answer on this address; check api.address")
            self._raise_for(status, body)
        return dict(payload)  # type: ignore[arg-type]

    def stats(self) -> dict[str, Any]:
        return self._get_json("/v1/stats")

    def signature(self) -> dict[str, Any]:
        return self._get_json("/v1/signature")
