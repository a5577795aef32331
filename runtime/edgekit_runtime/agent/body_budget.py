"""The bytes of request bodies the local API holds at once, for all connections together.

Each request's body is bounded on its own (``api.max_request_mb``, and what the model's inputs can need,
:mod:`edgekit_runtime.agent.http_guard`), but every connection has its own thread: 64 of them each
sending a 60 MB body that fits would hold 3.8 GB. So a body's ``Content-Length`` is reserved here before
a byte of it is read and given back when its request has been answered (the body, its parsed tensors and
the reply are gone by then). A body that would take the bodies in flight past the budget is refused with
503 ``busy_bodies`` and ``Retry-After``; one larger than the whole budget can never fit and is refused
with 413. A parsed body costs at most about twice its size in memory (its bytes, then its values as numpy
arrays), so the API's bodies hold at most about twice the budget.

The default budget is a quarter of ``models.memory_budget_mb`` when that is set, else a quarter of 512
MiB (what a small device gives the agent): :func:`default_inflight_body_bytes`.
"""

from __future__ import annotations

import threading
from http import HTTPStatus

from edgekit_runtime.agent.http_guard import Refusal

MIB = 1024 * 1024
#: what the agent may use on a small device when ``models.memory_budget_mb`` does not say
DEFAULT_AGENT_MEMORY_MB = 512
#: the share of the agent's memory that request bodies in flight may reserve (they cost up to 2x in RSS)
BODY_SHARE_OF_MEMORY = 0.25
#: seconds a client refused for the budget is asked to wait before sending again
RETRY_AFTER_S = 1
SETTING = "api.max_inflight_body_mb"


def default_inflight_body_bytes(memory_budget_mb: float | None) -> int:
    """A quarter of ``models.memory_budget_mb``, or of :data:`DEFAULT_AGENT_MEMORY_MB` without one."""
    budget_mb = DEFAULT_AGENT_MEMORY_MB if memory_budget_mb is None else memory_budget_mb
    return int(budget_mb * BODY_SHARE_OF_MEMORY * MIB)


DEFAULT_INFLIGHT_BODY_BYTES = default_inflight_body_bytes(None)


class BodyBudget:
    """Bytes reserved by the request bodies being read, parsed or served; thread-safe."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._reserved = 0
        self._lock = threading.Lock()
        self.refused_bodies = 0

    @property
    def reserved_bytes(self) -> int:
        return self._reserved

    def reserve(self, length: int) -> Refusal | None:
        """Reserve ``length`` bytes; a refusal (413 over the whole budget, 503 over what is left) when not."""
        if length > self.limit_bytes:
            return Refusal(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "too_large",
                           f"request body of {length} bytes is more than the agent holds for all request bodies at once "
                           f"({self.limit_bytes} bytes, {SETTING})", f"send a smaller body, or raise {SETTING}")  # fmt: skip
        with self._lock:
            if self._reserved + length <= self.limit_bytes:
                self._reserved += length
                return None
            in_flight = self._reserved
            self.refused_bodies += 1
        return Refusal(HTTPStatus.SERVICE_UNAVAILABLE, "busy_bodies",
                       f"request body of {length} bytes does not fit beside the {in_flight} bytes of bodies the agent "
                       f"serves now ({self.limit_bytes} at most, {SETTING})",
                       f"send it again after Retry-After ({RETRY_AFTER_S} s), or raise {SETTING}")  # fmt: skip

    def release(self, length: int) -> None:
        with self._lock:
            self._reserved -= length
