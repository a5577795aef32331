"""Size limits for what the agent publishes about untrusted or unbounded input.

Every event leaves the agent at most :data:`MAX_EVENT_BYTES` of JSON, far below the collector's
limit, so a deploy that fails with a 800 KB error message still reports its outcome. An event over
the limit keeps its envelope (kind, level, message, command_id) and loses detail from the inside out:
long strings are cut (``...[truncated: 812345 characters]``), long lists and objects keep their first
entries and say how many were left out, deep nesting becomes a marker; ``details.truncated_from_bytes``
then gives the size before. :func:`excerpt` bounds a quotation of an untrusted value (a command id,
a payload) in the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgekit_runtime.agent.telemetry import encode_message

#: The most bytes of JSON one event may take (the collector accepts 256 KiB).
MAX_EVENT_BYTES = 16 * 1024
#: How many characters of an untrusted id or payload an event quotes.
MAX_EXCERPT_CHARS = 200
_MAX_ITEMS = 32
_MAX_DEPTH = 6
_STRING_LIMITS = (4096, 1024, 256, 64)


def excerpt(text: str, max_chars: int = MAX_EXCERPT_CHARS) -> str:
    """``text`` itself when short enough, else its start and a marker with the full length."""
    if len(text) <= max_chars:
        return text
    marker = f"...[truncated: {len(text)} characters]"
    return text[: max(max_chars - len(marker), 0)] + marker


def excerpt_bytes(data: bytes, max_chars: int = MAX_EXCERPT_CHARS) -> str:
    """The start of untrusted bytes as text (undecodable bytes replaced), with the full size when cut."""
    if len(data) <= max_chars:
        return data.decode("utf-8", errors="replace")
    marker = f"...[truncated: {len(data)} bytes]"
    return data[: max(max_chars - len(marker), 0)].decode("utf-8", errors="replace") + marker


def _shrink(value: Any, max_chars: int, depth: int) -> Any:
    if isinstance(value, str):
        return excerpt(value, max_chars)
    if isinstance(value, Mapping):
        if depth >= _MAX_DEPTH:
            return f"[object of {len(value)} keys nested too deep: truncated]"
        items = list(value.items())
        shrunk = {str(k)[:max_chars]: _shrink(v, max_chars, depth + 1) for k, v in items[:_MAX_ITEMS]}
        if len(items) > _MAX_ITEMS:
            shrunk["truncated_keys"] = len(items) - _MAX_ITEMS
        return shrunk
    if isinstance(value, (list, tuple)):
        if depth >= _MAX_DEPTH:
            return f"[list of {len(value)} items nested too deep: truncated]"
        shrunk_list = [_shrink(v, max_chars, depth + 1) for v in value[:_MAX_ITEMS]]
        if len(value) > _MAX_ITEMS:
            shrunk_list.append(f"[{len(value) - _MAX_ITEMS} more items truncated]")
        return shrunk_list
    return value


def bound_event(event: Mapping[str, Any], max_bytes: int = MAX_EVENT_BYTES) -> dict[str, Any]:
    """``event`` as a dict of at most ``max_bytes`` encoded; unchanged when it already fits."""
    size = len(encode_message(event))
    bounded = dict(event)
    if size <= max_bytes:
        return bounded
    details = event.get("details")
    if isinstance(details, Mapping):
        for max_chars in _STRING_LIMITS:
            bounded["details"] = {**_shrink(details, max_chars, 0), "truncated_from_bytes": size}
            if len(encode_message(bounded)) <= max_bytes:
                return bounded
    bounded["details"] = {"truncated_from_bytes": size}
    for field, max_chars in (("message", 1024), ("command_id", 64)):
        if isinstance(bounded.get(field), str):
            bounded[field] = excerpt(bounded[field], max_chars)
    return bounded
