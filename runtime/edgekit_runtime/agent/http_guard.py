"""Checks that keep hostile web pages away from loopback HTTP servers (the agent's local API, the fleet
dashboard), and the size bound of a JSON inference request.

A page at any origin can make the user's browser send requests to ``http://127.0.0.1:PORT``: a "simple"
cross-origin request (``text/plain``, form or multipart body, ``no-cors``) is sent without asking the
server first, and DNS rebinding turns the attacker's own host name into ``127.0.0.1`` so that even
the reply can be read. Three checks close both doors:

* :meth:`HostPolicy.host_refusal`: the ``Host`` header, when there is one, must name a loopback host (``localhost``,
  ``*.localhost``, ``127.0.0.0/8``, ``::1``), the address the server is bound to, or a name the user
  allowed. A rebound name (``attacker.example``) is refused (421).
* :meth:`HostPolicy.origin_refusal`: a request that carries an ``Origin`` (browsers send one with every
  cross-origin request and every POST) must come from such a host too; ``Origin: null`` (sandboxed
  frames, ``file://``) is refused (403).
* :func:`content_type_refusal`: a JSON endpoint refuses the content types a page may send without a
  CORS preflight (``text/plain``, ``application/x-www-form-urlencoded``, ``multipart/form-data``) with
  415.

:func:`json_body_limit` is the largest body a model's inputs can need as JSON (from its signature's
fixed sizes and dim bounds), checked against ``Content-Length`` before a byte is read;
:func:`check_json_item_counts` bounds the values and arrays a body may hold before ``json.loads`` builds
one Python object per value.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

#: Content types a web page may POST cross-origin without a CORS preflight (the Fetch standard's list).
SIMPLE_REQUEST_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"})
#: The most bytes one tensor value may take in a JSON request: ``-1.2345678901234567e-308`` (24) plus a
#: separator and some indentation.
JSON_BYTES_PER_VALUE = 32
#: Room for the request's keys, names, dtypes, shapes and parameters around the tensor data.
JSON_OVERHEAD_BYTES = 64 * 1024
#: Commas and ``[`` a request may hold beyond one per input value (the shapes, keys and parameters).
JSON_ITEM_SLACK = 1024


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: the status, a short machine-readable kind, a message and a hint."""

    status: HTTPStatus
    kind: str
    message: str
    hint: str


def media_type(header: str | None) -> str:
    """``application/json`` from ``Application/JSON; charset=utf-8``; ``""`` when there is none."""
    return (header or "").split(";", 1)[0].strip().lower()


def split_host(authority: str) -> str | None:
    """The host of a ``Host`` header or URL authority, lower-case, without port or IPv6 brackets; None when
    it cannot be one (empty, user info, a bracket left open, a port that is not digits)."""
    authority = authority.strip().lower()
    if not authority or "@" in authority or any(c in authority for c in " /\\?#"):
        return None
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            return None
        host, rest = authority[1:end], authority[end + 1 :]
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return None
        return host or None
    host, _, port = authority.partition(":")
    if port and not (port.isascii() and port.isdigit()):
        return None
    return host or None


def is_loopback_host(host: str) -> bool:
    """``localhost``, a name under ``.localhost`` (browsers resolve those to loopback themselves, RFC 6761),
    or a loopback address."""
    host = host.rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HostPolicy:
    """Which ``Host`` and ``Origin`` values a server accepts: loopback names and addresses, the address it
    is bound to (unless a wildcard), and ``allowed_hosts`` (names or addresses, without ports; ``*`` turns
    the checks off). ``setting`` names where users add a host, for the refusal's hint."""

    def __init__(self, allowed_hosts: Iterable[str] = (), *, bound_host: str | None = None, setting: str) -> None:
        names = {name.strip().lower().rstrip(".") for name in allowed_hosts if name.strip()}
        self.allow_any = "*" in names
        names.discard("*")
        if bound_host and bound_host not in ("0.0.0.0", "::", ""):
            names.add(bound_host.strip("[]").lower())
        self.allowed = frozenset(split_host(name) or name for name in names)
        self.setting = setting

    def allows(self, host: str) -> bool:
        return self.allow_any or is_loopback_host(host) or host.rstrip(".") in self.allowed

    def host_refusal(self, header: str | None) -> Refusal | None:
        """421 for a malformed or unknown ``Host`` (what DNS rebinding sends); None when allowed or absent
        (HTTP/1.0 programs; every browser sends one)."""
        if self.allow_any or header is None:
            return None
        host = split_host(header or "")
        if host is not None and self.allows(host):
            return None
        shown = (header or "")[:80]
        return Refusal(HTTPStatus.MISDIRECTED_REQUEST, "unknown_host",
                       f"Host {shown!r} is not a name this server answers to (loopback names and addresses"
                       f"{', ' + ', '.join(sorted(self.allowed)) if self.allowed else ''})",
                       f"use http://127.0.0.1:PORT or http://localhost:PORT, or add the name to {self.setting}")  # fmt: skip

    def origin_refusal(self, header: str | None) -> Refusal | None:
        """403 for an ``Origin`` from a host this server does not answer to (another site's page); None when
        there is no ``Origin`` (not a browser, or a same-origin GET) or it is allowed."""
        if header is None or self.allow_any:
            return None
        parsed = urllib.parse.urlsplit(header.strip())
        host = split_host(parsed.netloc) if parsed.scheme in ("http", "https") and not parsed.path else None
        if host is not None and self.allows(host):
            return None
        return Refusal(HTTPStatus.FORBIDDEN, "forbidden_origin",
                       f"requests from web pages at {header[:80]!r} are refused: only pages from this host may call it",
                       f"call it from a program (curl, AgentClient), or add the page's host to {self.setting}")  # fmt: skip


def content_type_refusal(content_type: str | None, accepted: Iterable[str]) -> Refusal | None:
    """415 for a JSON endpoint's body sent as ``text/plain``, a form or multipart (what a page may send
    cross-origin without a preflight) or any type not in ``accepted``; None for an accepted or absent type."""
    kind = media_type(content_type)
    accepted = tuple(accepted)
    if not kind or kind in accepted:
        return None
    why = " (a type any web page may send without asking)" if kind in SIMPLE_REQUEST_TYPES else ""
    return Refusal(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type",
                   f"Content-Type {kind[:60]!r} is not accepted here{why}", f"send {' or '.join(accepted)}")  # fmt: skip


# -- the size a model's inputs can need ------------------------------------------------------------------


def max_input_values(signature: Any) -> int | None:
    """How many values one request for ``signature`` can hold at most (every dim at its bound); None when a
    dimension has no bound (``"?"`` or a dim name without ``io.dims`` bounds) or an input is a string tensor
    (its elements have no fixed size: ``api.max_request_mb`` bounds such requests)."""
    total = 0
    for tensor in signature.inputs:
        if tensor.dtype == "string":
            return None
        count = 1
        for dim in tensor.shape:
            if isinstance(dim, int):
                count *= dim
                continue
            bounds = signature.dims.get(dim)
            if bounds is None:
                return None
            count *= int(bounds.max)
        total += count
    return total


def describe_inputs(signature: Any) -> str:
    return ", ".join(signature.describe_tensor(tensor) for tensor in signature.inputs)


def json_body_limit(signature: Any) -> int | None:
    """The largest JSON (or binary) request body ``signature``'s inputs can need; None when unbounded."""
    values = max_input_values(signature)
    return None if values is None else JSON_OVERHEAD_BYTES + JSON_BYTES_PER_VALUE * values


def body_limit_refusal(length: int, signature: Any, model: str, *, setting: str) -> Refusal | None:
    """413 when a body of ``length`` bytes is larger than any request ``signature`` can need."""
    limit = json_body_limit(signature)
    if limit is None or length <= limit:
        return None
    return Refusal(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "too_large",
                   f"request body of {length} bytes is more than model {model!r} can need ({limit} bytes at most for "
                   f"{describe_inputs(signature)}, every dim at its bound, {JSON_BYTES_PER_VALUE} bytes a value as JSON)",
                   f"send at most the model's inputs; {setting} bounds models without dim bounds")  # fmt: skip


def check_json_item_counts(body: bytes | bytearray, signature: Any, model: str) -> Refusal | None:
    """400 when a JSON body holds more values (commas) or arrays (``[``) than ``signature``'s inputs can, or
    more than 8,192 strings (names and keys need a few dozen), counted on the bytes before anything parses them."""
    values = max_input_values(signature)
    if values is None:
        return None
    limit = values + JSON_ITEM_SLACK
    commas, arrays, quotes = body.count(b","), body.count(b"["), body.count(b'"')
    if commas <= limit and arrays <= limit and quotes <= 16 * JSON_ITEM_SLACK:
        return None
    what = f"{commas} commas" if commas > limit else f"{arrays} arrays" if arrays > limit else f"{quotes // 2} strings"
    return Refusal(HTTPStatus.BAD_REQUEST, "input_signature",
                   f"request body holds {what}, more than the inputs of model {model!r} can take ({values} values at most: "
                   f"{describe_inputs(signature)})", "send one value per input element")  # fmt: skip

