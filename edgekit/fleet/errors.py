"""Errors of the fleet side: stores, the collector and the fleet CLI."""

from __future__ import annotations

from edgekit.errors import EdgekitError


class FleetError(EdgekitError):
    """Base of the fleet-side errors (collector, stores, rollout, dashboard)."""


class StoreError(FleetError):
    """The fleet store cannot be opened, migrated, or refused a write or a query."""


class StoreUnavailableError(StoreError):
    """The store's database cannot be reached right now (connection lost, database locked); retry later."""


class CollectorError(FleetError):
    """The collector cannot start: bad broker URL, unusable TLS files, a port already in use."""


__all__ = ["CollectorError", "FleetError", "StoreError", "StoreUnavailableError"]
