"""A client for the agent's local API (:mod:`edgekit_runtime.agent.api`), for applications on the device.

::

    client = AgentClient("127.0.0.1:8470")          # or "unix:/run/edgekit/agent.sock"
    logits = client.infer({"image": batch})["logits"]

Each call opens its own connection, so one client may be shared between threads.
"""

from __future__ import annotations

import http.client
import json
import socket
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

    def _connection(self) -> http.client.HTTPConnection:
        if self.address.unix_path is not None:
            return _UnixHTTPConnection(str(self.address.unix_path), self.timeout_s)
        return http.client.HTTPConnection(self.address.host or "127.0.0.1", self.address.port, timeout=self.timeout_s)

    def _request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        connection = self._connection()
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        except OSError as err:
            raise AgentApiError(
                f"cannot reach the edgekit agent at {self.address}: {err.strerror or err}",
                hint="is edgekit-agent running (systemctl status edgekit-agent), and is api.address the same?",
            ) from err
        finally:
            connection.close()

    def _raise_for(self, status: int, body: bytes) -> None:
        try:
            payload = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
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
        return dict(json.loads(body.decode("utf-8")))

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
        return decode_json_tensors(json.loads(response.decode("utf-8"))["outputs"], section="outputs")

    def health(self) -> dict[str, Any]:
        """``/v1/health``; a 503 (no model, degraded) still returns the payload rather than raising."""
        status, _, body = self._request("GET", "/v1/health")
        if status not in (200, 503):
            self._raise_for(status, body)
        return dict(json.loads(body.decode("utf-8")))

    def stats(self) -> dict[str, Any]:
        return self._get_json("/v1/stats")

    def signature(self) -> dict[str, Any]:
        return self._get_json("/v1/signature")
