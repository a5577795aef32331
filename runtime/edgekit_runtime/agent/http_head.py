"""The request line and headers of a plain HTTP/1.1 request, parsed without the standard library's email parser.

``BaseHTTPRequestHandler.parse_request`` hands the headers to ``http.client.parse_headers``, which runs
``email.feedparser`` over them: about a quarter of the agent's own Python time per inference request
(cProfile of the OIP HTTP path, digits-cnn, docs/agent.md "Where a request's time goes"). The API's handler
has already read the head line by line and refused malformed lines (``_malformed_head``), so the common case
(``HTTP/1.1``, no ``Expect``, at most 100 headers) only needs splitting; anything else goes to the standard
library as before. The result is the same: the same method, path, version, keep-alive decision and header
values (``email``'s compat32 policy: the value after the colon with leading blanks removed).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

#: http.client's bound on header lines; more go to the standard library, which answers 431
_MAX_HEADERS = 100


class RequestHeaders:
    """A request's headers, read like ``email.message.Message``: ``get`` (the first value of a name, any
    case), ``get_all``, ``in``, ``[name]``, ``items()``."""

    __slots__ = ("_items", "_by_name")

    def __init__(self, items: list[tuple[str, str]]) -> None:
        self._items = items
        by_name: dict[str, list[str]] = {}
        for name, value in items:
            by_name.setdefault(name.lower(), []).append(value)
        self._by_name = by_name

    def get(self, name: str, default: Any = None) -> Any:
        values = self._by_name.get(name.lower())
        return values[0] if values else default

    def get_all(self, name: str, failobj: Any = None) -> Any:
        values = self._by_name.get(name.lower())
        return list(values) if values else failobj

    def __getitem__(self, name: str) -> str | None:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._by_name

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> list[tuple[str, str]]:
        return list(self._items)

    def keys(self) -> list[str]:
        return [name for name, _ in self._items]

    def values(self) -> list[str]:
        return [value for _, value in self._items]

    def __str__(self) -> str:
        return "".join(f"{name}: {value}\n" for name, value in self._items) + "\n"


def parse_plain_head(handler: Any, lines: list[bytes]) -> bool:
    """Set ``handler``'s ``command``, ``path``, ``request_version``, ``requestline``, ``headers`` and
    ``close_connection`` from ``lines`` (the request line, header lines, the empty line; already checked by
    the handler) as ``parse_request`` would, and return True; False (nothing set) when the request is not the
    plain case and the standard library must parse it."""
    if len(lines) - 2 > _MAX_HEADERS or handler.protocol_version != "HTTP/1.1":
        return False
    words = lines[0].split()
    if len(words) != 3 or words[2] != b"HTTP/1.1":
        return False
    items = []
    for line in lines[1:-1]:
        name, _, value = line.decode("iso-8859-1").partition(":")
        items.append((name, value.lstrip(" \t").rstrip("\r\n")))
    headers = RequestHeaders(items)
    if "expect" in headers:  # 100-continue: the standard library answers it
        return False
    path = words[1].decode("iso-8859-1")
    if path.startswith("//"):  # as parse_request: never a scheme-relative URL (gh-87389)
        path = "/" + path.lstrip("/")
    handler.command = words[0].decode("iso-8859-1")
    handler.path = path
    handler.request_version = "HTTP/1.1"
    handler.requestline = lines[0].decode("iso-8859-1").rstrip("\r\n")
    handler.headers = headers
    handler.close_connection = headers.get("Connection", "").lower() == "close"
    return True
