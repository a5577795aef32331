"""One exception hierarchy for edgekit, shared by the host pipeline and the device runtime.

User-facing errors derive from :class:`EdgekitError`; their message says what went wrong, where
(file, field, node, tensor) and how to fix it. Bugs in edgekit itself raise :class:`InternalError`.
"""

from __future__ import annotations

import errno

#: errnos of a write that found no room: the file system is full, or the user's quota is used up
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class EdgekitError(Exception):
    """Base of every error a user can cause and fix."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message}\n  hint: {hint}")


class InternalError(Exception):
    """A bug in edgekit: please report it. Never raised for bad user input."""


class BundleError(EdgekitError):
    """A bundle is missing, malformed, tampered with, or fails its self-check."""


class InputSignatureError(EdgekitError):
    """Inference inputs do not match the model's signature (names, dtypes or shapes)."""


class BackendError(EdgekitError):
    """A backend cannot load or run a model (missing package, provider that did not load, ...)."""


class SensorError(EdgekitError):
    """A power or device-state sensor is unknown, unavailable, or returned something unreadable."""
