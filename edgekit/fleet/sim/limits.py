"""The open-files limit a big simulated fleet needs: one socket per device, plus a few."""

from __future__ import annotations

import logging

from edgekit_runtime.agent.topics import TelemetryError

logger = logging.getLogger(__name__)


def raise_open_files_limit(needed: int, *, what: str) -> int:
    """Raise this process's soft RLIMIT_NOFILE to at least ``needed`` (up to the hard limit) and return
    the soft limit now in force; raises :class:`TelemetryError` when the hard limit is below ``needed``.
    Does nothing on systems without ``resource`` (Windows)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return needed
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return needed if soft == resource.RLIM_INFINITY else soft
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise TelemetryError(
            f"{what} need {needed} open files, but this process may open at most {hard} (hard RLIMIT_NOFILE)",
            hint=f"raise it before starting (ulimit -Hn {needed} as root, or LimitNOFILE= in a systemd unit), "
            "or simulate fewer devices per process",
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    logger.info("raised the open-files limit from %d to %d for %s", soft, needed, what)
    return needed
