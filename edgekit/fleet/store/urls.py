"""Store URLs as messages, logs and answers may show them: without a password."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redact(url: str) -> str:
    """``url`` without its password (``postgresql://user:***@host/db``), for messages, logs and HTTP answers."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


__all__ = ["redact"]
