"""The serving core every protocol uses: request -> validated tensors -> model -> response.

``/v1`` (:mod:`edgekit_runtime.agent.api`), the Open Inference Protocol over HTTP
(:mod:`edgekit_runtime.agent.oip`) and over gRPC (:mod:`edgekit_runtime.agent.oip_grpc`) are thin
adapters: each turns its wire format into numpy feeds (with :func:`parse_json_request` for a JSON body),
runs them with :func:`run_model` on the model's :class:`~edgekit_runtime.agent.serving.InferenceServer`
(its signature check, queue, batching, statistics and health watch), and words a :class:`ServingError`
in its own error format and status code.
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

import numpy as np

from edgekit_runtime.agent.errors import NoModelError
from edgekit_runtime.agent.http_guard import check_json_item_counts
from edgekit_runtime.agent.json_tensors import loads_tensor_json
from edgekit_runtime.errors import EdgekitError, InputSignatureError


class ServingError(Exception):
    """Why the model did not answer: ``kind`` ``input_signature`` (400, the request does not fit the model),
    ``no_model`` (503, no bundle loaded) or ``inference_failed`` (500, the model failed to run)."""

    def __init__(self, status: HTTPStatus, kind: str, message: str, hint: str | None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.hint = status, kind, message, hint


def parse_json_request(body: bytearray, signature: Any, model: str) -> Any:
    """The JSON value of a request ``body`` for ``signature``'s model: its values and arrays counted against
    the model's inputs first (an :class:`InputSignatureError` when there are more), then parsed with large
    arrays of numbers read straight into numpy (:mod:`~edgekit_runtime.agent.json_tensors`); the body's
    buffer is emptied once parsed. Malformed JSON raises what ``json``/UTF-8 decoding raise, for each
    protocol to word."""
    refusal = None if signature is None else check_json_item_counts(body, signature, model)
    if refusal is not None:
        raise InputSignatureError(refusal.message, hint=refusal.hint)
    payload = loads_tensor_json(body)
    body.clear()
    return payload


def run_model(server: Any, feeds: Mapping[str, np.ndarray]) -> Any:
    """``server.infer(feeds)``, the model's errors as :class:`ServingError`."""
    try:
        return server.infer(feeds)
    except EdgekitError as err:
        raise serving_error(err) from err


def serving_error(err: EdgekitError) -> ServingError:
    """The model's error ``err`` (from :meth:`~edgekit_runtime.agent.serving.InferenceServer.infer` or
    ``infer_together``) as a :class:`ServingError`."""
    if isinstance(err, InputSignatureError):
        return ServingError(HTTPStatus.BAD_REQUEST, "input_signature", err.message, err.hint)
    if isinstance(err, NoModelError):
        return ServingError(HTTPStatus.SERVICE_UNAVAILABLE, "no_model", err.message, err.hint)
    return ServingError(HTTPStatus.INTERNAL_SERVER_ERROR, "inference_failed", err.message, err.hint)


QUEUE_HEADER, COMPUTE_HEADER = "X-Edgekit-Queue-Ms", "X-Edgekit-Compute-Ms"


def timing_headers(result: Any) -> dict[str, str]:
    """The reply headers every HTTP protocol sends with a result: queue and compute time in milliseconds."""
    return {QUEUE_HEADER: f"{result.timing.queue_ms:.4f}", COMPUTE_HEADER: f"{result.timing.compute_ms:.4f}"}


def timing_header_lines(result: Any) -> str:
    """:func:`timing_headers` as header lines (each ending in CRLF), for a server that writes its head itself."""
    timing = result.timing
    return f"{QUEUE_HEADER}: {timing.queue_ms:.4f}\r\n{COMPUTE_HEADER}: {timing.compute_ms:.4f}\r\n"
