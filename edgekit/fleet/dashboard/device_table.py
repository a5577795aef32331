"""The dashboard's device table, one page at a time: filtered, sorted and cut on the server, so the page never
receives the whole fleet (10,000 devices were 3.3 MB on every refresh). States come from the store's
:class:`~edgekit.fleet.store.base.DeviceSummary` (judged once, in :mod:`edgekit.fleet.liveness`); the power
mode and model columns are looked up for the page's devices only.

``/api/devices?fleet=&q=&state=&sort=&order=&offset=&limit=``

==========  ==========================================================================================
``fleet``   one fleet (default: every fleet)
``q``       text every shown column is searched for, case-insensitive (device, fleet, state, bundle,
            target, power mode, models)
``state``   comma-separated states (``offline,stale``); the four liveness states or one an agent reported
``sort``    ``worst`` (default: offline, stale, unknown and other reported states before online; in each, the
            devices with an alert firing, then the highest p99 first) or a column (:data:`SORT_COLUMNS`); empty
            values sort last either way
``order``   ``asc`` (default) or ``desc``
``offset``  rows to skip (default 0)
``limit``   rows in the page, 1 to :data:`MAX_LIMIT` (default :data:`DEFAULT_LIMIT`)
==========  ==========================================================================================
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgekit.fleet.dashboard.api import device_row
from edgekit.fleet.errors import FleetError
from edgekit.fleet.liveness import STATES
from edgekit.fleet.store.base import DeviceSummary, FleetStore

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_QUERY_CHARS = 200
#: The largest ``offset``: beyond any fleet, within the store's 64-bit integers.
MAX_OFFSET = 2**62
#: The device table's ``models``: the models a device reported windows of in this long (issue 20).
MODELS_SEEN_S = 3600.0
#: Columns the table sorts by, each with the summary value it sorts on (``power_mode`` is looked up apart).
SORT_COLUMNS: dict[str, Callable[[DeviceSummary], Any]] = {
    "device": lambda s: s.device, "fleet": lambda s: s.fleet, "state": lambda s: s.state,
    "bundle_id": lambda s: s.bundle_id, "target": lambda s: s.target, "p50_ms": lambda s: s.p50_ms,
    "p99_ms": lambda s: s.p99_ms, "power_mw": lambda s: s.power_mean_mw,
    "energy_per_inference_mj": lambda s: s.energy_per_inference_mj, "temperature_c": lambda s: s.temperature_max_c,
    "last_seen": lambda s: s.last_seen, "missing_seqs": lambda s: s.missing_seqs, "windows": lambda s: s.windows,
}  # fmt: skip
SORTS = ("worst", *SORT_COLUMNS, "power_mode")
ORDERS = ("asc", "desc")
#: "Worst first": lower ranks first. A state an agent reported that is neither of the four (``updating``) ranks
#: with ``unknown``: not known to be healthy.
WORST_RANK = {"offline": 0, "stale": 1, "unknown": 2, "online": 4}
_OTHER_RANK = 2
_STATE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class DeviceQueryError(FleetError):
    """A parameter of ``/api/devices`` is not valid (the API answers 400 naming it)."""

    def __init__(self, parameter: str, message: str, *, hint: str | None = None) -> None:
        self.parameter = parameter
        super().__init__(message, hint=hint)


def _integer(params: Mapping[str, str], name: str, default: int, low: int, high: int | None) -> int:
    text = params.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise DeviceQueryError(name, f"{name} must be an integer, got {text!r}") from None
    if value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise DeviceQueryError(name, f"{name} must be {bounds}, got {value}")
    return value


@dataclass(frozen=True)
class DeviceQuery:
    """One page of the device table, as asked for (see the module docstring)."""

    fleet: str | None = None
    q: str = ""
    states: tuple[str, ...] = ()
    sort: str = "worst"
    order: str = "asc"
    offset: int = 0
    limit: int = DEFAULT_LIMIT

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> DeviceQuery:
        """Read and check the query string; raises :class:`DeviceQueryError` naming the first bad parameter."""
        q = params.get("q", "").strip()
        if len(q) > MAX_QUERY_CHARS:
            raise DeviceQueryError("q", f"q must be at most {MAX_QUERY_CHARS} characters, got {len(q)}")
        if any(ord(c) < 32 or ord(c) == 127 for c in q):  # no name holds one; SQLite would cut the text at a NUL
            raise DeviceQueryError("q", "q must not contain control characters (NUL, newline, escape, ...)")
        states = tuple(dict.fromkeys(s.strip() for s in params.get("state", "").split(",") if s.strip()))
        bad = [s for s in states if not _STATE_NAME.match(s)]
        if bad:
            raise DeviceQueryError("state", f"state {bad[0]!r} is not a state name",
                                   hint=f"give comma-separated states, e.g. {','.join(STATES)}")  # fmt: skip
        sort = params.get("sort") or "worst"
        if sort not in SORTS:
            raise DeviceQueryError("sort", f"sort must be one of {', '.join(SORTS)}, got {sort!r}")
        order = params.get("order") or "asc"
        if order not in ORDERS:
            raise DeviceQueryError("order", f"order must be asc or desc, got {order!r}")
        return cls(fleet=params.get("fleet") or None, q=q, states=states, sort=sort, order=order,
                   offset=_integer(params, "offset", 0, 0, MAX_OFFSET),
                   limit=_integer(params, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT))  # fmt: skip


Breaching = Collection[tuple[str, str]]


def worst_first_key(breaching: Breaching = frozenset()) -> Callable[[DeviceSummary], tuple[int, bool, bool, float, str, str]]:
    """Offline, then stale, then unknown (and other reported states), then online; in each, the devices with an alert
    firing (``breaching``: (fleet, device) pairs) first, then the highest p99."""

    def key(summary: DeviceSummary) -> tuple[int, bool, bool, float, str, str]:
        p99 = summary.p99_ms
        return (WORST_RANK.get(summary.state, _OTHER_RANK), (summary.fleet, summary.device) not in breaching,
                p99 is None, -(p99 or 0.0), summary.fleet, summary.device)  # fmt: skip

    return key


def _sorted(summaries: list[DeviceSummary], query: DeviceQuery, power_modes: Mapping[tuple[str, str], str | None],
            breaching: Breaching) -> list[DeviceSummary]:  # fmt: skip
    descending = query.order == "desc"
    if query.sort == "worst":
        return sorted(summaries, key=worst_first_key(breaching), reverse=descending)
    value: Callable[[DeviceSummary], Any] = (
        (lambda s: power_modes.get((s.fleet, s.device))) if query.sort == "power_mode" else SORT_COLUMNS[query.sort]
    )
    keyed = [(value(s), s) for s in sorted(summaries, key=lambda s: (s.fleet, s.device))]
    present = [pair for pair in keyed if pair[0] is not None]
    present.sort(key=lambda pair: pair[0], reverse=descending)  # stable: ties stay by fleet, device
    return [s for _, s in present] + [s for v, s in keyed if v is None]  # empty values last either way


class DeviceTable:
    """Pages of the device table from one store. ``power_modes``, ``model_names`` and ``breaching`` (the devices
    with an alert firing) may be cached callables (the app keeps them for a while); by default the first two ask the
    store each time and no device is breaching."""

    def __init__(self, store: FleetStore, *,
                 power_modes: Callable[[str | None], Mapping[tuple[str, str], str | None]] | None = None,
                 model_names: Callable[[str | None], Sequence[str]] | None = None,
                 breaching: Callable[[str | None], Breaching | None] | None = None) -> None:  # fmt: skip
        self.store = store
        self.breaching = breaching or (lambda fleet: frozenset())
        self.power_modes = power_modes or (lambda fleet: {(i.fleet, i.device): i.power_mode for i in store.device_identities(fleet)})
        self.model_names = model_names or (lambda fleet: store.known_values("model", fleet=fleet))

    def page(self, query: DeviceQuery, summaries: Sequence[DeviceSummary] | None = None, *,
             now: dt.datetime | None = None) -> dict[str, Any]:  # fmt: skip
        """The rows of ``query``'s page, the number of devices matching it (``total``) and in the fleet, and which
        optional columns (power mode, models) any device of the fleet has. The store filters, sorts and cuts the
        page (:meth:`~edgekit.fleet.store.device_reads.DeviceReadsMixin.device_page`); given the fleet's
        ``summaries``, this does it in Python instead (the same rows)."""
        now = now or dt.datetime.now(dt.timezone.utc)
        modes = self.power_modes(query.fleet)
        models = self.model_names(query.fleet)
        breaching = self.breaching(query.fleet) or frozenset()
        if summaries is None:
            found = self.store.device_page(  # type: ignore[attr-defined]
                query.fleet, states=query.states, q=query.q, q_devices=self._serving(query, models, now) if query.q else (),
                sort=query.sort, descending=query.order == "desc", breaching=breaching, offset=query.offset,
                limit=query.limit, now=now)  # fmt: skip
            page, page_modes, total, fleet_devices = found.devices, found.power_modes, found.total, found.fleet_devices
        else:
            matching = [s for s in summaries if not query.states or s.state in query.states]
            if query.q:
                matching = self._search(matching, query, modes, models, now)
            ordered = _sorted(matching, query, modes, breaching)
            page, page_modes = ordered[query.offset:query.offset + query.limit], modes
            total, fleet_devices = len(ordered), len(summaries)
        served = self._models(page, now) if models else {}
        return {
            "fleet": query.fleet, "q": query.q, "state": list(query.states), "sort": query.sort, "order": query.order,
            "offset": query.offset, "limit": query.limit, "total": total, "fleet_devices": fleet_devices,
            "columns": {"power_mode": any(m for m in modes.values()), "models": bool(models)},
            "devices": [device_row(s, page_modes.get((s.fleet, s.device)), served.get((s.fleet, s.device), ()))
                        | {"breaching": (s.fleet, s.device) in breaching} for s in page],
        }  # fmt: skip

    def _serving(self, query: DeviceQuery, models: Sequence[str], now: dt.datetime) -> set[tuple[str, str]]:
        """The devices that served, in the last :data:`MODELS_SEEN_S`, a model whose name holds ``query.q``."""
        needle = query.q.lower()
        serving: set[tuple[str, str]] = set()
        since = now - dt.timedelta(seconds=MODELS_SEEN_S)
        for model in (m for m in models if needle in m.lower()):  # only models whose name matches cost a query
            serving.update((row.fleet, row.device) for row in
                           self.store.model_aggregate(("fleet", "device"), fleet=query.fleet, model=model, since=since)  # fmt: skip
                           if row.fleet is not None and row.device is not None)
        return serving

    def _search(self, summaries: list[DeviceSummary], query: DeviceQuery, modes: Mapping[tuple[str, str], str | None],
                models: Sequence[str], now: dt.datetime) -> list[DeviceSummary]:  # fmt: skip
        needle = query.q.lower()
        serving = self._serving(query, models, now)

        def matches(s: DeviceSummary) -> bool:
            texts = (s.device, s.fleet, s.state, s.bundle_id, s.target, modes.get((s.fleet, s.device)))
            return any(t is not None and needle in t.lower() for t in texts) or (s.fleet, s.device) in serving

        return [s for s in summaries if matches(s)]

    def _models(self, page: Sequence[DeviceSummary], now: dt.datetime) -> dict[tuple[str | None, str | None], list[str]]:
        """The named models each of the page's devices served in the last :data:`MODELS_SEEN_S`."""
        if not page:
            return {}
        since = now - dt.timedelta(seconds=MODELS_SEEN_S)
        served: dict[tuple[str | None, str | None], list[str]] = {}
        rows = self.store.model_aggregate(("fleet", "device", "model"), devices=[(s.fleet, s.device) for s in page], since=since)
        for row in sorted(rows, key=lambda r: r.model or ""):
            if row.model is not None:
                served.setdefault((row.fleet, row.device), []).append(row.model)
        return served
