"""Store calls a long operation (a rollout) tries again while the store is briefly unavailable."""

from __future__ import annotations

import logging
import time
from typing import Any

from edgekit.fleet.errors import StoreUnavailableError

logger = logging.getLogger(__name__)

#: How long a rollout waits out a store that is down or locked (a PostgreSQL restart, a long retention batch).
STORE_PATIENCE_S = 60.0


def patiently(doing: str, call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)``, tried again for :data:`STORE_PATIENCE_S` while the store is unavailable: a rollout
    that has sent commands should not stop (its devices half switched) for a store that is back in seconds."""
    deadline = time.monotonic() + STORE_PATIENCE_S
    while True:
        try:
            return call(*args, **kwargs)
        except StoreUnavailableError as exc:
            if time.monotonic() >= deadline:
                raise
            logger.warning("%s: the store is unavailable (%s); trying again", doing, exc.message)
            time.sleep(1.0)


__all__ = ["STORE_PATIENCE_S", "patiently"]
