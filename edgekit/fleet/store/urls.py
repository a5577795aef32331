"""Store URLs as messages, logs and answers may show them: without a password."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit, urlunsplit

#: Query parameters libpq reads a secret (or where to find one) from: their values are masked too.
SECRET_QUERY_KEYS = frozenset({"password", "sslpassword", "passfile"})
MASK = "***"


def _redact_query(query: str) -> str:
    """``query`` with the value of each :data:`SECRET_QUERY_KEYS` parameter masked; the rest as it was."""
    pieces = []
    for piece in query.split("&"):
        key, equals, _ = piece.partition("=")
        pieces.append(f"{key}={MASK}" if equals and unquote(key).strip().lower() in SECRET_QUERY_KEYS else piece)
    return "&".join(pieces)


def redact(url: str) -> str:
    """``url`` without its password (``postgresql://user:***@host/db``), for messages, logs and HTTP answers: the
    password in the user part and the ``password``, ``sslpassword`` and ``passfile`` query parameters libpq also
    reads are masked; the host part is kept as written (an IPv6 address keeps its brackets, several hosts stay)."""
    parts = urlsplit(url)
    netloc, query = parts.netloc, _redact_query(parts.query) if parts.query else parts.query
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.partition(':')[0]}:{MASK}@{hosts}"
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))


__all__ = ["SECRET_QUERY_KEYS", "redact"]
