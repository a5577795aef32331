"""Routes of the dashboard: the page and its script, and the JSON endpoints under ``/api/``.

==========================  ====================================================================
``/``                       the page (static HTML; everything else is fetched from ``/api/``)
``/static/<file>``          the page's script and style sheet (no CDN: works offline)
``/api/overview``           devices per state, bundle versions, rollouts, rejected counts, recent events, fleets
``/api/devices``            ``?q=&state=&sort=&order=&offset=&limit=``: one page of the device table (see
                            :mod:`~edgekit.fleet.dashboard.device_table`), sorted and filtered here
``/api/series``             ``?fleet=F&device=D&hours=24&points=300``: one device over time
``/api/device``             ``?fleet=F&device=D``: its identity, its newest events, the rollouts that included it
``/api/fleet-series``       ``?by=bundle_id|target|power_mode|model&hours=24``: p50/p99/worst p99/power (by model: throughput) per group
``/api/bundle-series``      ``?hours=24``: the same by bundle, under ``bundles``
``/api/rollouts``           the latest 50 rollouts, summarized: devices per outcome, the devices that did not succeed
                            (at most 50 each), health figures (see :mod:`~edgekit.fleet.dashboard.rollout_summary`)
``/api/rollout``            ``?id=ROLLOUT_ID``: one rollout's whole record, every device's outcome and result
``/api/rejected``           rejected-message counts by reason
``/healthz``                ``ok``
==========================  ====================================================================

Every endpoint takes an optional ``fleet``; a ``fleet`` (or ``device``) no device ever reported is a 404 with a
JSON error listing those the store knows; a bad parameter is a 400 whose JSON error names it (``parameter``).
Results are cached for ``cache_s`` seconds. The store counts the devices per state and bundle, and filters, sorts
and cuts each page of the device table, in SQL (:mod:`edgekit.fleet.store.device_reads`): no request reads the whole
fleet's summaries. The counts are kept for 5 s (at least ``cache_s``); the fleets, power modes, model names and the
median telemetry interval (rarely changing) for 30 s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

from edgekit.fleet.alerts import active_alerts
from edgekit.fleet.dashboard import api
from edgekit.fleet.dashboard.device_page import device_detail
from edgekit.fleet.dashboard.device_table import DeviceQuery, DeviceQueryError, DeviceTable
from edgekit.fleet.dashboard.rollout_summary import rollout_summary
from edgekit.fleet.dashboard.http import HttpServer, Request, Response
from edgekit.fleet.errors import FleetError, StoreError, StoreUnavailableError
from edgekit.fleet.report import unknown_filter_error
from edgekit.fleet.rollout_state import RolloutLog, open_rollout_log
from edgekit.fleet.store.base import FleetStore
from edgekit.fleet.store.postgres import redact

logger = logging.getLogger(__name__)

STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".txt": "text/plain; charset=utf-8", ".svg": "image/svg+xml"}  # fmt: skip


class DashboardError(FleetError):
    """The dashboard cannot start (port in use, store unreachable)."""


#: How long the fleets, power modes and model names are kept (when responses are cached at all).
SLOW_CHANGING_TTL_S = 30.0
#: How long the device counts are kept at least (when responses are cached at all): shorter than the page's 10 s
#: refresh, so each refresh shows the states judged anew.
SUMMARIES_TTL_S = 5.0
#: What a 503 for an unreachable store asks the client to wait before asking again (seconds).
STORE_RETRY_AFTER_S = 5


def _parameter_error(parameter: str, message: str) -> Response:
    return Response.json({"error": message, "status": 400, "parameter": parameter}, 400)


class _Kept:
    """Answers of ``compute(key)`` kept for ``ttl_s`` seconds (0: never kept)."""

    def __init__(self, compute: Callable[[Any], Any], ttl_s: float) -> None:
        self.compute, self.ttl_s = compute, ttl_s
        self._kept: dict[Any, tuple[float, Any]] = {}

    def __call__(self, key: Any) -> Any:
        now = time.monotonic()
        hit = self._kept.get(key)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        value = self.compute(key)
        if self.ttl_s > 0:
            if len(self._kept) > 64:
                self._kept.clear()
            self._kept[key] = (now, value)
        return value


def _static(name: str) -> bytes:
    return resources.files("edgekit.fleet.dashboard").joinpath("static").joinpath(name).read_bytes()


class DashboardApp:
    """Answers requests from one store. Runs on the server's single worker thread, which owns the store."""

    def __init__(self, store_url: str, *, cache_s: float = 2.0) -> None:
        self.store_url = store_url
        self.cache_s = cache_s
        self._store: FleetStore | None = None
        self._rollouts: RolloutLog | None = None
        self._cache: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, Response]] = {}
        self._owner: int | None = None
        self._known: dict[tuple[str, str | None], set[str]] = {}  # (key, fleet) -> values the store has reported
        self._ranges = api.SeriesRanges(ttl_s=60.0 if cache_s > 0 else 0.0)  # tests with cache_s=0 see every change
        slow_ttl = SLOW_CHANGING_TTL_S if cache_s > 0 else 0.0
        # the fleet-level counts of the overview: kept a little longer than answers, between two refreshes
        summaries_ttl = max(cache_s, SUMMARIES_TTL_S) if cache_s > 0 else 0.0
        self._counts = _Kept(lambda fleet: self.store.device_counts(fleet), summaries_ttl)
        self._simulated = _Kept(lambda fleet: self.store.simulated_devices(fleet), summaries_ttl)
        self._median_interval_s = _Kept(lambda fleet: self.store.median_interval_s(fleet), slow_ttl)
        self._breaching = _Kept(self._devices_breaching, summaries_ttl)  # reads up to 100,000 alert events
        self._fleets = _Kept(lambda _: self.store.known_values("fleet"), slow_ttl)
        self._power_modes = _Kept(lambda fleet: {(i.fleet, i.device): i.power_mode for i in self.store.device_identities(fleet)},
                                  slow_ttl)  # fmt: skip
        self._model_names = _Kept(lambda fleet: self.store.known_values("model", fleet=fleet), slow_ttl)

    def open(self) -> None:
        """Open the store (and the rollout table) on the calling thread."""
        from edgekit.fleet.store import open_store

        self._owner = threading.get_ident()
        self._store = open_store(self.store_url)
        self._rollouts = open_rollout_log(self.store_url)

    def close(self) -> None:
        for resource in (self._rollouts, self._store):
            if resource is not None:
                resource.close()
        self._store = self._rollouts = None

    @property
    def store(self) -> FleetStore:
        if self._store is None:
            self.open()
        return self._store  # type: ignore[return-value]

    def handle(self, request: Request) -> Response:
        path = request.path
        if path in ("/", "/index.html"):
            return Response(200, _static("index.html"), STATIC_TYPES[".html"], {"Cache-Control": "no-cache"})
        if path.startswith("/static/"):
            name = path[len("/static/"):]
            suffix = name[name.rfind("."):] if "." in name else ""
            if "/" in name or ".." in name or suffix not in STATIC_TYPES:
                return Response.error(404, f"no static file {name!r}")
            try:
                return Response(200, _static(name), STATIC_TYPES[suffix], {"Cache-Control": "max-age=300"})
            except (OSError, ValueError):  # missing, a folder, a name too long, a NUL in it
                return Response.error(404, f"no static file {name[:80]!r}")
        if path == "/healthz":
            return Response(200, b"ok\n")
        if path.startswith("/api/"):
            try:
                return self._cached(request)
            except StoreUnavailableError as exc:  # the database is down or restarting: the page retries, nothing is wrong here
                logger.warning("dashboard request %s: %s", path, exc.message)
                response = Response.error(503, exc.message + (f"; {exc.hint}" if exc.hint else ""))
                response.headers["Retry-After"] = str(STORE_RETRY_AFTER_S)
                return response
        return Response.error(404, f"no page at {path}")

    def _cached(self, request: Request) -> Response:
        key = (request.path, tuple(sorted(request.query.items())))
        hit = self._cache.get(key)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.cache_s:
            return hit[1]
        response = self._api(request)
        if response.status == 200:
            if len(self._cache) > 512:
                self._cache.clear()
            self._cache[key] = (now, response)
        return response

    def _api(self, request: Request) -> Response:
        query, store = request.query, self.store
        fleet = query.get("fleet") or None
        try:
            hours = float(query.get("hours", "24"))
        except ValueError:
            return _parameter_error("hours", f"hours must be a number, got {query['hours']!r}")
        try:
            points = int(query.get("points", str(api.DEFAULT_POINTS)))
        except ValueError:
            return _parameter_error("points", f"points must be an integer, got {query['points']!r}")
        if not 0 < hours <= api.MAX_HOURS:
            return _parameter_error("hours", f"hours must be in (0, {api.MAX_HOURS}], got {hours:g}")
        if not 2 <= points <= api.MAX_POINTS:
            return _parameter_error("points", f"points must be in [2, {api.MAX_POINTS}], got {points}")
        endpoint = request.path[len("/api/"):]
        unknown = self._unknown("fleet", fleet) or (self._unknown("device", query.get("device"), fleet=fleet)
                                                    if endpoint in ("series", "device") and fleet else None)  # fmt: skip
        if unknown is not None:
            return unknown
        payload: Any
        if endpoint == "overview":
            breaching = self._breaching(fleet)
            payload = api.overview(store, self._rollouts, fleet=fleet, counts=self._counts(fleet), fleets=self._fleets(None),
                                   breaching=None if breaching is None else len(breaching),
                                   simulated=self._simulated(fleet))  # fmt: skip
        elif endpoint == "devices":
            try:
                table_query = DeviceQuery.from_params(query)
            except DeviceQueryError as err:
                return _parameter_error(err.parameter, err.message + (f"; {err.hint}" if err.hint else ""))
            table = DeviceTable(store, power_modes=self._power_modes, model_names=self._model_names, breaching=self._breaching)
            payload = table.page(table_query)
        elif endpoint == "series":
            device = query.get("device")
            if not device or not fleet:
                return _parameter_error("device" if fleet else "fleet", "series needs ?fleet=F&device=D")
            payload = api.device_series(store, fleet, device, hours=hours, points=points, ranges=self._ranges)
        elif endpoint == "device":  # the device page: identity, its events, its rollouts (device_page.py)
            device = query.get("device")
            if not device or not fleet:
                return _parameter_error("device" if fleet else "fleet", "device needs ?fleet=F&device=D")
            payload = device_detail(store, self._rollouts, fleet, device)
        elif endpoint == "fleet-series":
            by = query.get("by", "bundle_id")
            if by not in api.FLEET_GROUPS:
                return _parameter_error("by", f"by must be one of {', '.join(api.FLEET_GROUPS)}, got {by!r}")
            payload = api.fleet_series(store, fleet=fleet, by=by, hours=hours, points=points, ranges=self._ranges,
                                       window_s=lambda: self._median_interval_s(fleet))  # fmt: skip
        elif endpoint == "bundle-series":
            payload = api.bundle_series(store, fleet=fleet, hours=hours, points=points, ranges=self._ranges,
                                        window_s=lambda: self._median_interval_s(fleet))  # fmt: skip
        elif endpoint == "rollouts":
            payload = [rollout_summary(r) for r in self._rollouts.recent(50, fleet)] if self._rollouts else []
        elif endpoint == "rollout":
            return self._rollout(query.get("id"), fleet)
        elif endpoint == "rejected":
            payload = store.rejected_counts()
        else:
            return Response.error(404, f"no API endpoint {endpoint!r}")
        return Response.json(payload)

    def _rollout(self, rollout_id: str | None, fleet: str | None) -> Response:
        """One rollout's whole record (``/api/rollout?id=ID``): what a summary of ``/api/rollouts`` leaves out."""
        if not rollout_id:
            return _parameter_error("id", "rollout needs ?id=ROLLOUT_ID (the rollout_id of a rollout /api/rollouts lists)")
        try:
            record = self._rollouts.get(rollout_id) if self._rollouts is not None else None
        except StoreUnavailableError:
            raise
        except StoreError as err:  # its stored JSON is damaged: said, not a bare 500
            return Response.json({"error": err.message + (f"; {err.hint}" if err.hint else ""), "status": 500, "parameter": "id"}, 500)
        if record is None or (fleet is not None and record.fleet != fleet):
            where = f" in fleet {fleet!r}" if fleet is not None else ""
            message = f"query id: no rollout {rollout_id[:80]!r}{where} in the store; /api/rollouts lists the rollout_id of each"
            return Response.json({"error": message, "status": 404, "parameter": "id"}, 404)
        return Response.json(record.to_json())

    def _devices_breaching(self, fleet: str | None) -> frozenset[tuple[str, str]] | None:
        """Devices with an alert firing (:func:`edgekit.fleet.alerts.active_alerts`, read from the alert events the
        collector stores); None, and the overview leaves the count out, when they cannot be read."""
        try:
            alerts = active_alerts(self.store, fleet=fleet)
        except Exception:  # the overview still answers without the count; the log says why
            logger.exception("active_alerts failed: the overview leaves out 'breaching'")
            return None
        return frozenset((a.fleet, a.device) for a in alerts if a.device)  # a rollout's alert names no device

    def _unknown(self, key: str, value: str | None, *, fleet: str | None = None) -> Response | None:
        """404 (JSON, listing the values the store knows) for a ``fleet`` or ``device`` no device ever reported, instead
        of an empty 200. Values once seen stay known, so the store is asked again only for a value not seen yet."""
        if not value:
            return None
        seen = self._known.setdefault((key, fleet), set())
        if value not in seen:
            seen.update(self.store.known_values(key, fleet=fleet))
        if value in seen:
            return None
        error = unknown_filter_error(self.store, f"query {key}", key, value, fleet=fleet)
        return Response.error(404, f"{error.message}; {error.hint}") if error is not None else None


class DashboardServer:
    """``DashboardServer("sqlite:///fleet.db", port=8480).start()``; ``url``; ``stop()``. A context manager."""

    def __init__(self, store_url: str, *, host: str = "127.0.0.1", port: int = 8480, cache_s: float = 2.0) -> None:
        self.app = DashboardApp(store_url, cache_s=cache_s)
        self.http = HttpServer(self.app.handle, host, port)

    @property
    def url(self) -> str:
        return self.http.url

    def start(self) -> DashboardServer:
        try:
            self.http.start()
            self.http.run_in_worker(lambda: self.app.store)  # open the store now: a bad URL fails here, not on first load
        except OSError as err:
            self.http.stop()
            raise DashboardError(f"cannot listen on {self.http.host}:{self.http.port}: {err.strerror or err}",
                                 hint="pick another --port (or stop what uses this one)") from err  # fmt: skip
        except FleetError:
            self.http.stop()
            raise
        logger.info("dashboard on %s (store %s)", self.url, redact(self.app.store_url))
        return self

    def stop(self) -> None:
        try:
            self.http.run_in_worker(self.app.close)
        except RuntimeError:
            pass
        self.http.stop()

    def __enter__(self) -> DashboardServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
