"""The fleet dashboard (``edgekit fleet dashboard``): a page served by a small asyncio HTTP server, with
JSON under ``/api/`` and plots drawn in the browser as SVG by the page's own script (no CDN, works
offline). See :mod:`edgekit.fleet.dashboard.app` for the routes."""

from edgekit.fleet.dashboard.app import DashboardApp, DashboardError, DashboardServer

__all__ = ["DashboardApp", "DashboardError", "DashboardServer"]
