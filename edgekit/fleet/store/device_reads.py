"""Reads of the device table done in SQL: liveness, counts, filter, sort and paging over device_latest, so a reader of
10,000 devices receives a page, not 10,000 Python objects (issue 27).

Each device's state is judged in the query (:func:`state_sql`) exactly as :func:`edgekit.fleet.liveness.liveness_state`
judges it in Python (``stale`` after 3 silent telemetry intervals, ``offline`` after 10 or a last will); the rows of a
page still become :class:`~edgekit.fleet.store.base.DeviceSummary` through
:func:`~edgekit.fleet.store.summaries.summary_from_row`, judged again in Python at the same ``now``, so both agree.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from edgekit.fleet.liveness import DEFAULT_INTERVAL_S, OFFLINE_AFTER_INTERVALS, STALE_AFTER_INTERVALS, STATE_RANK, STATES
from edgekit.fleet.store.base import DeviceSummary
from edgekit.fleet.store.summaries import summary_from_row

#: The columns of :data:`edgekit.fleet.store.queries.SUMMARIES`, as :func:`summary_from_row` reads them.
SUMMARY_COLUMNS = ("fleet", "device", "reported", "status_bundle", "status_at", "windows", "seq_min", "seq_max",
                   "received_at_max", "latest_seq", "latest_bundle", "p50_ms", "p99_ms", "power_mean_mw",
                   "energy_per_inference_mj", "temperature_max_c", "interval_s", "target")  # fmt: skip
#: ``fleet status --json`` fields (:func:`edgekit.fleet.report.summary_to_json`) and the view's column of each.
DEVICE_ROW_COLUMNS = (("fleet", "fleet"), ("device", "device"), ("state", "state"), ("bundle_id", "shown_bundle"),
                      ("target", "target"), ("p50_ms", "shown_p50_ms"), ("p99_ms", "shown_p99_ms"),
                      ("power_mean_mw", "shown_power_mw"), ("energy_per_inference_mj", "shown_energy_mj"),
                      ("temperature_max_c", "shown_temperature_c"), ("last_seen", "last_seen"), ("windows", "windows"),
                      ("missing_seqs", "missing_seqs"), ("interval_s", "shown_interval_s"))  # fmt: skip
DEVICE_ROW_FIELDS = tuple(field for field, _ in DEVICE_ROW_COLUMNS)
#: What the device table sorts by (``/api/devices?sort=``): a column of :func:`device_view_sql`.
SORT_SQL = {"device": "device", "fleet": "fleet", "state": "state", "bundle_id": "shown_bundle", "target": "target",
            "p50_ms": "shown_p50_ms", "p99_ms": "shown_p99_ms", "power_mw": "shown_power_mw",
            "energy_per_inference_mj": "shown_energy_mj", "temperature_c": "shown_temperature_c",
            "last_seen": "last_seen", "missing_seqs": "missing_seqs", "windows": "windows",
            "power_mode": "power_mode"}  # fmt: skip
#: Columns ``q`` searches (case-insensitive substring), as the table shows them.
SEARCHED_SQL = ("device", "fleet", "state", "shown_bundle", "target", "power_mode")
#: "Worst first" ranks: the dashboard's (a state an agent reported that is none of the four ranks with unknown) and
#: ``fleet status``'s (:data:`edgekit.fleet.liveness.STATE_RANK`: other states between unknown and online).
TABLE_RANKS = ({"offline": 0, "stale": 1, "unknown": 2, "online": 4}, 2)
STATUS_RANKS = (STATE_RANK, 3)
#: A device as one text, for lists of devices passed as one parameter ('/' never appears in a fleet or device name: both
#: are MQTT topic levels).
DEVICE_KEY_SQL = "fleet || '/' || device"
#: ``LIMIT`` of a page without one (SQLite and PostgreSQL both take a 64-bit limit; neither takes NULL alike).
ALL_ROWS = 2**62
NO_FILTER = "1 = 1"


def _keys_sql(fleet_filter: str) -> str:
    return (f"SELECT fleet, device FROM device_status WHERE {fleet_filter} "
            f"UNION SELECT fleet, device FROM device_latest WHERE {fleet_filter} "
            f"UNION SELECT fleet, device FROM device_targets WHERE {fleet_filter}")  # fmt: skip


def state_sql(store: Any) -> str:
    """SQL of a device's state from the columns ``reported``, ``last_seen``, ``has_latest``, ``interval_s`` and the
    parameter ``:now`` (:func:`edgekit.fleet.liveness.liveness_state`, in SQL)."""
    interval = f"(CASE WHEN interval_s > 0 THEN interval_s ELSE {DEFAULT_INTERVAL_S!r} END)"
    silent = store.seconds_sql("last_seen", ":now")
    return (f"CASE WHEN reported = 'offline' THEN 'offline' "
            f"WHEN last_seen IS NULL OR has_latest = 0 OR interval_s IS NULL THEN COALESCE(NULLIF(reported, ''), 'unknown') "
            f"WHEN {silent} >= {OFFLINE_AFTER_INTERVALS} * {interval} THEN 'offline' "
            f"WHEN {silent} >= {STALE_AFTER_INTERVALS} * {interval} THEN 'stale' "
            f"ELSE COALESCE(NULLIF(reported, ''), 'online') END")  # fmt: skip


def device_view_sql(store: Any, fleet: str | None) -> str:
    """A subquery of every device (of ``fleet``): the :data:`SUMMARY_COLUMNS`, what the table shows (``state``,
    ``shown_*``, ``last_seen``, ``missing_seqs``) and the power mode. Parameters ``:now`` and ``:fleet``."""
    fleet_filter = "fleet = :fleet" if fleet is not None else "1 = 1"
    base = f"""SELECT k.fleet AS fleet, k.device AS device, s.state AS reported, s.bundle_id AS status_bundle,
        s.updated_at AS status_at, COALESCE(l.windows, 0) AS windows, l.seq_min AS seq_min, l.seq_max AS seq_max,
        l.received_at_max AS received_at_max, l.latest_seq AS latest_seq, l.bundle_id AS latest_bundle, l.p50_ms AS p50_ms,
        l.p99_ms AS p99_ms, l.power_mean_mw AS power_mean_mw, l.energy_per_inference_mj AS energy_per_inference_mj,
        l.temperature_max_c AS temperature_max_c, l.interval_s AS interval_s, t.target AS target,
        i.power_mode AS power_mode
    FROM ({_keys_sql(fleet_filter)}) k
    LEFT JOIN device_status s ON s.fleet = k.fleet AND s.device = k.device
    LEFT JOIN device_latest l ON l.fleet = k.fleet AND l.device = k.device
    LEFT JOIN device_targets t ON t.fleet = k.fleet AND t.device = k.device
    LEFT JOIN device_identity i ON i.fleet = k.fleet AND i.device = k.device"""
    received = "CASE WHEN b.windows > 0 THEN b.received_at_max END"
    seen = f"""SELECT b.*, {store.greatest_sql(received, 'b.status_at')} AS last_seen,
        CASE WHEN b.windows > 0 AND b.latest_seq IS NOT NULL THEN 1 ELSE 0 END AS has_latest FROM ({base}) b"""
    shown = ", ".join(f"CASE WHEN has_latest = 1 THEN {column} END AS {name}" for column, name in (
        ("p50_ms", "shown_p50_ms"), ("p99_ms", "shown_p99_ms"), ("power_mean_mw", "shown_power_mw"),
        ("energy_per_inference_mj", "shown_energy_mj"), ("temperature_max_c", "shown_temperature_c"),
        ("interval_s", "shown_interval_s")))  # fmt: skip
    gaps = store.greatest_sql("seq_max - seq_min + 1 - windows", "0")
    return f"""SELECT d.*, {state_sql(store)} AS state, {shown},
        CASE WHEN has_latest = 1 THEN latest_bundle ELSE status_bundle END AS shown_bundle,
        CASE WHEN windows > 0 THEN {gaps} ELSE 0 END AS missing_seqs
    FROM ({seen}) d"""


@dataclass(frozen=True)
class DeviceCounts:
    """The fleet-level figures of the device table: devices per state (:data:`STATES` always, then any other state
    reported, by name) and bundle versions (devices, how many online, on which targets; most devices first, then by
    bundle id)."""

    devices: int
    states: dict[str, int]
    bundles: list[dict[str, Any]]
    #: each fleet that has devices (sorted) with the states its devices are in
    fleet_states: dict[str, set[str]]
    #: devices per state on each target (None: no target known)
    target_states: dict[str | None, dict[str, int]]

    def fleets(self, states: Collection[str] = ()) -> list[str]:
        """The fleets with devices (in one of ``states``, when given)."""
        return [fleet for fleet, found in self.fleet_states.items() if not states or found & set(states)]

    def states_on(self, target: str) -> dict[str, int]:
        """Devices per state among those on ``target`` (:data:`STATES` always)."""
        return self.target_states.get(target) or dict.fromkeys(STATES, 0)


@dataclass(frozen=True)
class DevicePage:
    """A page of the device table: its devices with their power modes, how many devices match the filters
    (``total``) and how many the fleet has."""

    devices: list[DeviceSummary]
    power_modes: dict[tuple[str, str], str | None]
    total: int
    fleet_devices: int


class DeviceReadsMixin:
    """:meth:`device_counts`, :meth:`device_page` and :meth:`agent_versions` of :class:`edgekit.fleet.store.sql.SqlFleetStore`."""

    _query: Any
    time_in: Any
    time_out: Any
    in_list_sql: Any
    list_in: Any
    #: What makes ORDER BY of text compare code points, as Python does (PostgreSQL: COLLATE "C").
    text_order_sql: str = ""
    #: The SQL function that lower-cases text for the device search (every letter, not ASCII only).
    lower_sql: str = "LOWER"

    def _view(self, fleet: str | None, now: dt.datetime) -> tuple[str, dict[str, Any]]:
        params: dict[str, Any] = {"now": self.time_in(now)}
        if fleet is not None:
            params["fleet"] = fleet
        return device_view_sql(self, fleet), params

    def agent_versions(self, fleet: str | None = None) -> dict[tuple[str, str], str | None]:
        """(fleet, device) -> the agent version of its last status (:meth:`FleetStore.agent_versions`)."""
        sql = "SELECT fleet, device, agent_version FROM device_status" + (" WHERE fleet = :fleet" if fleet is not None else "")
        rows = self._query("reading agent versions", sql, {"fleet": fleet} if fleet is not None else {})
        return {(row[0], row[1]): row[2] for row in rows}

    def simulated_devices(self, fleet: str | None = None) -> int:
        """Devices whose last status came from the simulator (:meth:`FleetStore.simulated_devices`), counted in the store."""
        from edgekit.fleet.rollout_bundle import SIMULATED_AGENT_PREFIX

        sql = "SELECT COUNT(*) FROM device_status WHERE agent_version LIKE :prefix" + (" AND fleet = :fleet" if fleet is not None else "")
        params = {"prefix": SIMULATED_AGENT_PREFIX + "%", **({"fleet": fleet} if fleet is not None else {})}
        return int(self._query("counting simulated devices", sql, params)[0][0])

    def device_counts(self, fleet: str | None = None, *, now: dt.datetime | None = None) -> DeviceCounts:
        """Devices per state and per bundle, counted in the store (one small result set however large the fleet)."""
        view, params = self._view(fleet, now or dt.datetime.now(dt.timezone.utc))
        rows = self._query("counting devices", f"SELECT shown_bundle, target, state, COUNT(*), fleet FROM ({view}) v "
                                               "GROUP BY fleet, shown_bundle, target, state", params)  # fmt: skip
        fleets: dict[str, set[str]] = {}
        targets: dict[str | None, list[Sequence[Any]]] = {}
        for row in rows:
            fleets.setdefault(row[4], set()).add(row[2])
            targets.setdefault(row[1], []).append(row)
        return DeviceCounts(devices=sum(int(r[3]) for r in rows), states=_state_counts(rows), bundles=_bundle_rows(rows),
                            fleet_states=dict(sorted(fleets.items())),
                            target_states={target: _state_counts(found) for target, found in targets.items()})  # fmt: skip

    def median_interval_s(self, fleet: str | None = None) -> float | None:
        """The median device's telemetry interval (its newest window's length), None when no device has one."""
        view, params = self._view(fleet, dt.datetime.now(dt.timezone.utc))
        intervals = self._query("reading telemetry intervals", f"SELECT shown_interval_s FROM ({view}) v "
                                                               "WHERE shown_interval_s <> 0 ORDER BY shown_interval_s", params)  # fmt: skip
        return float(intervals[len(intervals) // 2][0]) if intervals else None

    def device_page(self, fleet: str | None = None, *, states: Sequence[str] = (), q: str = "",
                    q_devices: Collection[tuple[str, str]] = (), sort: str = "worst", descending: bool = False,
                    breaching: Collection[tuple[str, str]] = (), offset: int = 0, limit: int | None = None,
                    worst_ranks: tuple[dict[str, int], int] = TABLE_RANKS,
                    now: dt.datetime | None = None) -> DevicePage:  # fmt: skip
        """One page of devices (``limit`` None: all from ``offset``) filtered by ``states`` and ``q`` (a
        case-insensitive substring of a shown column, or one of ``q_devices``), sorted by ``sort`` (``worst``: offline,
        stale, unknown, online by ``worst_ranks``; in each the devices ``breaching`` first, then the highest p99;
        else a key of :data:`SORT_SQL`, empty values last) in the store."""
        now = now or dt.datetime.now(dt.timezone.utc)
        view, params = self._view(fleet, now)
        where = self._page_filters(params, states, q, q_devices)
        total = int(self._query("counting devices", f"SELECT COUNT(*) FROM ({view}) v WHERE {where}", params)[0][0])
        fleet_devices = total if where == NO_FILTER else self._fleet_devices(fleet)
        order = self._page_order(params, sort, descending, breaching, worst_ranks)
        params.update(limit=ALL_ROWS if limit is None else limit, offset=offset)
        columns = ", ".join(SUMMARY_COLUMNS)
        rows = self._query("reading a page of devices", f"SELECT {columns}, power_mode FROM ({view}) v WHERE {where} "
                                                        f"ORDER BY {order} LIMIT :limit OFFSET :offset", params)  # fmt: skip
        time_out = self.time_out
        page = [summary_from_row(row[:-1], now, time_out) for row in rows]
        return DevicePage(page, {(s.fleet, s.device): row[-1] for s, row in zip(page, rows)}, total, fleet_devices)

    def device_rows(self, fleet: str | None = None, *, states: Sequence[str] = (),
                    now: dt.datetime | None = None) -> Iterator[tuple[Any, ...]]:  # fmt: skip
        """Every device (of ``fleet``, in one of ``states``) by fleet and device, as the values of
        :data:`DEVICE_ROW_FIELDS` (``last_seen`` ISO 8601 UTC), straight from the rows: no per-device object, for
        ``fleet status --json`` and ``--csv``."""
        view, params = self._view(fleet, now or dt.datetime.now(dt.timezone.utc))
        where = self._page_filters(params, states, "", ())
        columns = ", ".join(column for _, column in DEVICE_ROW_COLUMNS)
        rows = self._query("reading every device", f"SELECT {columns} FROM ({view}) v WHERE {where} ORDER BY fleet, device", params)
        time_out = self.time_out
        for (fleet_name, device, state, bundle, target, p50, p99, power, energy, temperature, last_seen, windows, gaps,
             interval) in rows:  # fmt: skip
            seen = None if last_seen is None else time_out(last_seen).isoformat().replace("+00:00", "Z")
            yield (fleet_name, device, state, bundle, target, _float(p50), _float(p99), _float(power), _float(energy),
                   _float(temperature), seen, int(windows), int(gaps), _float(interval))  # fmt: skip

    def _fleet_devices(self, fleet: str | None) -> int:
        keys = _keys_sql("fleet = :fleet" if fleet is not None else "1 = 1")
        return int(self._query("counting devices", f"SELECT COUNT(*) FROM ({keys}) k", {"fleet": fleet} if fleet is not None else {})[0][0])

    def _page_filters(self, params: dict[str, Any], states: Sequence[str], q: str,
                      q_devices: Collection[tuple[str, str]]) -> str:  # fmt: skip
        clauses = [NO_FILTER]
        if states:
            params["states"] = self.list_in(list(states))
            clauses.append(self.in_list_sql("state", "states"))
        if q:
            params["q"] = "%" + q.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            found = [f"{self.lower_sql}({column}) LIKE :q ESCAPE '\\'" for column in SEARCHED_SQL]
            if q_devices:
                params["q_devices"] = self.list_in([f"{f}/{d}" for f, d in q_devices])
                found.append(self.in_list_sql(DEVICE_KEY_SQL, "q_devices"))
            clauses.append("(" + " OR ".join(found) + ")")
        return " AND ".join(clauses[1:]) or NO_FILTER

    def _page_order(self, params: dict[str, Any], sort: str, descending: bool, breaching: Collection[tuple[str, str]],
                    worst_ranks: tuple[dict[str, int], int]) -> str:  # fmt: skip
        text = self.text_order_sql
        if sort != "worst":
            column = SORT_SQL[sort]
            collate = text if column in ("device", "fleet", "state", "shown_bundle", "target", "power_mode") else ""
            return (f"CASE WHEN {column} IS NULL THEN 1 ELSE 0 END, {column}{collate} {'DESC' if descending else 'ASC'}, "
                    f"fleet{text}, device{text}")  # fmt: skip
        ranks, other = worst_ranks
        rank = "CASE " + " ".join(f"WHEN state = '{state}' THEN {value}" for state, value in ranks.items()) + f" ELSE {other} END"
        calm = "1"
        if breaching:
            params["breaching"] = self.list_in([f"{f}/{d}" for f, d in breaching])
            calm = f"CASE WHEN {self.in_list_sql(DEVICE_KEY_SQL, 'breaching')} THEN 0 ELSE 1 END"
        up, down = ("DESC", "ASC") if descending else ("ASC", "DESC")
        return (f"{rank} {up}, {calm} {up}, CASE WHEN shown_p99_ms IS NULL THEN 1 ELSE 0 END {up}, shown_p99_ms {down}, "
                f"fleet{text} {up}, device{text} {up}")  # fmt: skip


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _state_counts(rows: Sequence[Sequence[Any]]) -> dict[str, int]:
    counts = dict.fromkeys(STATES, 0)
    for row in sorted(rows, key=lambda r: r[2]):
        counts[row[2]] = counts.get(row[2], 0) + int(row[3])
    return counts


def _bundle_rows(rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    bundles: dict[str | None, dict[str, Any]] = {}
    for bundle, target, state, count, _ in rows:
        entry = bundles.setdefault(bundle, {"bundle_id": bundle, "devices": 0, "online": 0, "targets": set()})
        entry["devices"] += int(count)
        entry["online"] += int(count) if state == "online" else 0
        if target:
            entry["targets"].add(target)
    ordered = sorted(bundles.values(), key=lambda e: (-e["devices"], e["bundle_id"] is not None, e["bundle_id"] or ""))
    return [e | {"targets": sorted(e["targets"])} for e in ordered]


__all__ = ["DEVICE_ROW_FIELDS", "DeviceCounts", "DevicePage", "DeviceReadsMixin", "SORT_SQL", "STATUS_RANKS", "TABLE_RANKS", "device_view_sql", "state_sql"]
