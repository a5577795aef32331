"""SQL text shared by the SQLite and PostgreSQL stores.

Placeholders are written ``?`` (positional) or ``:name`` (named); each store rewrites them for its
driver. The few expressions that differ between the two (durations, time buckets, GREATEST) come
from the store's dialect hooks, so one query serves both databases.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from edgekit.fleet.store.dialect import SqlDialect

CREATE_SCHEMA_VERSION = """CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at TEXT NOT NULL
)"""

UPSERT_STATUS = """INSERT INTO device_status (fleet, device, state, bundle_id, agent_version, updated_at, payload)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (fleet, device) DO UPDATE SET state = excluded.state, bundle_id = excluded.bundle_id,
    agent_version = excluded.agent_version, updated_at = excluded.updated_at, payload = excluded.payload
WHERE excluded.updated_at >= device_status.updated_at OR device_status.updated_at > ?"""
# the last ? (in both upserts): stored times later than this are from a clock set back since (status_writes.py)

UPSERT_TARGET = """INSERT INTO device_targets (fleet, device, target, updated_at) VALUES (?, ?, ?, ?)
ON CONFLICT (fleet, device) DO UPDATE SET target = excluded.target, updated_at = excluded.updated_at"""

UPSERT_ROLLOUT = """INSERT INTO edgekit_rollouts (rollout_id, fleet, bundle_id, state, started_at, updated_at, record)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (rollout_id) DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at, record = excluded.record"""

UPSERT_IDENTITY = """INSERT INTO device_identity (fleet, device, board, soc, os, l4t, jetpack, cuda, tensorrt, onnxruntime,
    power_mode, clocks_locked, identity, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (fleet, device) DO UPDATE SET board = excluded.board, soc = excluded.soc, os = excluded.os, l4t = excluded.l4t,
    jetpack = excluded.jetpack, cuda = excluded.cuda, tensorrt = excluded.tensorrt, onnxruntime = excluded.onnxruntime,
    power_mode = excluded.power_mode, clocks_locked = excluded.clocks_locked, identity = excluded.identity,
    updated_at = excluded.updated_at
WHERE excluded.updated_at >= device_identity.updated_at OR device_identity.updated_at > ?"""
SELECT_IDENTITIES = """SELECT fleet, device, board, soc, os, l4t, jetpack, cuda, tensorrt, onnxruntime, power_mode,
    clocks_locked, identity, updated_at FROM device_identity WHERE {fleet_filter} ORDER BY fleet, device"""

#: Where each filter value a device can report is stored (table, column); :func:`known_values_sql` unions them. No
#: raw window or rollup table: the aggregates kept at ingest name every fleet, device, bundle and model they saw.
KNOWN_VALUE_SOURCES: dict[str, tuple[tuple[str, str], ...]] = {
    "fleet": (("device_status", "fleet"), ("device_targets", "fleet"), ("device_latest", "fleet"),
              ("device_events", "fleet"), ("edgekit_rollouts", "fleet")),
    "device": (("device_status", "device"), ("device_targets", "device"), ("device_latest", "device"),
               ("device_events", "device")),
    "bundle_id": (("device_status", "bundle_id"), ("device_bundles", "bundle_id"), ("fleet_model_buckets", "bundle_id"),
                  ("edgekit_rollouts", "bundle_id")),
    "target": (("device_targets", "target"),),
    "model": (("fleet_model_buckets", "model"),),
}  # fmt: skip


def known_values_sql(key: str, *, in_fleet: bool) -> str:
    """Distinct non-empty values of ``key`` in every table that stores it, sorted; ``in_fleet``: only rows of ``:fleet``."""
    fleet_filter = " AND fleet = :fleet" if in_fleet else ""
    selects = [f"SELECT {column} AS v FROM {table} WHERE {column} IS NOT NULL AND {column} <> ''{fleet_filter}"
               for table, column in KNOWN_VALUE_SOURCES[key]]
    return f"SELECT DISTINCT v FROM ({' UNION '.join(selects)}) known ORDER BY v"


INSERT_REJECTED = "INSERT INTO rejected_messages (topic, reason, detail, size_bytes, at) VALUES (?, ?, ?, ?, ?)"

ADD_REJECTED_TOTAL = """INSERT INTO rejected_totals (reason, count) VALUES (?, ?)
ON CONFLICT (reason) DO UPDATE SET count = rejected_totals.count + excluded.count"""

#: Device summaries: every device with a status, a window or a target, in one query that reads no raw window
#: (device_latest is kept as windows arrive). {fleet_filter} is written for each table.
SUMMARIES = """SELECT k.fleet, k.device, s.state, s.bundle_id, s.updated_at, l.windows, l.seq_min, l.seq_max,
    l.received_at_max, l.latest_seq, l.bundle_id, l.p50_ms, l.p99_ms, l.power_mean_mw, l.energy_per_inference_mj,
    l.temperature_max_c, l.interval_s, t.target
FROM (SELECT fleet, device FROM device_status WHERE {fleet_filter}
      UNION SELECT fleet, device FROM device_latest WHERE {fleet_filter}
      UNION SELECT fleet, device FROM device_targets WHERE {fleet_filter}) k
LEFT JOIN device_status s ON s.fleet = k.fleet AND s.device = k.device
LEFT JOIN device_latest l ON l.fleet = k.fleet AND l.device = k.device
LEFT JOIN device_targets t ON t.fleet = k.fleet AND t.device = k.device
ORDER BY k.fleet, k.device"""

#: Rollups as :func:`edgekit.fleet.store.buckets.rollup_parts` reads them.
SELECT_ROLLUPS_AS_PARTS = """SELECT fleet, device, bundle_id, windows, inferences, errors, latency_count, p50_sum, p99_sum,
    p99_max_ms, power_s, power_mw_s, energy_mj, energy_active_mj, energy_count, temperature_max_c, window_start_min,
    window_end_max, seq_min, seq_max, received_at_max FROM telemetry_rollups ORDER BY fleet, device, bucket_start"""

#: Per-model windows and rollups as :func:`edgekit.fleet.store.buckets.model_history_parts` reads them.
SELECT_MODEL_HISTORY = """SELECT fleet, device, model, bundle_id, 1, inferences, errors,
    CASE WHEN p50_ms IS NULL THEN 0 ELSE inferences END, COALESCE(p50_ms * inferences, 0.0),
    COALESCE(p99_ms * inferences, 0.0), p99_ms, memory_mb, window_start, window_end FROM telemetry_model_windows
UNION ALL
SELECT fleet, device, model, bundle_id, windows, inferences, errors, latency_count, p50_sum, p99_sum, p99_max_ms,
    memory_mb_max, window_start_min, window_end_max FROM telemetry_model_rollups"""

SELECT_ROLLED_SEQS = "SELECT r.fleet, r.device, r.seq_first, r.seq_last, r.window_end_max, r.rolled_at FROM telemetry_rolled_seqs r"
INSERT_ROLLED_SEQS = """INSERT INTO telemetry_rolled_seqs (fleet, device, seq_first, seq_last, window_end_max, rolled_at)
VALUES (?, ?, ?, ?, ?, ?)"""
#: Runs of consecutive seqs among windows ``w`` (per device: first, last, latest window end, count); {source}
#: and {where} name the rows.
ISLANDS_SQL = """SELECT fleet, device, MIN(seq), MAX(seq), MAX(window_end), COUNT(*) FROM (
    SELECT w.fleet, w.device, w.seq, w.window_end,
           w.seq - ROW_NUMBER() OVER (PARTITION BY w.fleet, w.device ORDER BY w.seq) AS island
    FROM {source} WHERE {where}
) numbered GROUP BY fleet, device, island"""

MISSING_SEQS = """SELECT prev + 1, seq - 1 FROM (
    SELECT seq, LAG(seq) OVER (ORDER BY seq) AS prev FROM telemetry_windows WHERE fleet = :fleet AND device = :device
) gaps WHERE seq - prev > 1 ORDER BY seq"""

#: Rollup columns and how raw windows (alias ``w``) sum into them; {dur} is the window's seconds.
ROLLUP_FROM_RAW: tuple[tuple[str, str], ...] = (
    ("windows", "COUNT(*)"),
    ("inferences", "SUM(w.inferences)"),
    ("errors", "SUM(w.errors)"),
    ("latency_count", "SUM(CASE WHEN w.p50_ms IS NULL THEN 0 ELSE w.inferences END)"),
    ("p50_sum", "SUM(COALESCE(w.p50_ms * w.inferences, 0.0))"),
    ("p90_sum", "SUM(COALESCE(w.p90_ms * w.inferences, 0.0))"),
    ("p99_sum", "SUM(COALESCE(w.p99_ms * w.inferences, 0.0))"),
    ("mean_sum", "SUM(COALESCE(w.mean_ms * w.inferences, 0.0))"),
    ("p99_max_ms", "MAX(w.p99_ms)"),
    ("max_ms", "MAX(w.max_ms)"),
    ("power_s", "SUM(CASE WHEN w.power_mean_mw IS NULL THEN 0.0 ELSE {dur} END)"),
    ("power_mw_s", "SUM(COALESCE(w.power_mean_mw * {dur}, 0.0))"),
    ("power_max_mw", "MAX(w.power_max_mw)"),
    ("energy_mj", "SUM(w.energy_mj)"),
    ("energy_active_mj", "SUM(CASE WHEN w.inferences > 0 THEN w.energy_mj END)"),
    ("energy_count", "SUM(CASE WHEN w.inferences > 0 AND w.energy_mj IS NOT NULL THEN w.inferences ELSE 0 END)"),
    ("temperature_max_c", "MAX(w.temperature_max_c)"),
    ("memory_used_mb_max", "MAX(w.memory_used_mb)"),
    ("seq_min", "MIN(w.seq)"),
    ("seq_max", "MAX(w.seq)"),
    ("window_start_min", "MIN(w.window_start)"),
    ("window_end_max", "MAX(w.window_end)"),
    ("received_at_max", "MAX(w.received_at)"),
)
_MAX_MERGED = ("p99_max_ms", "max_ms", "power_max_mw", "temperature_max_c", "memory_used_mb_max", "seq_max",
               "window_end_max", "received_at_max")  # fmt: skip
_MIN_MERGED = ("seq_min", "window_start_min")
_NULLABLE_SUMS = ("energy_mj", "energy_active_mj")


def window_seconds_sql(store: SqlDialect, alias: str = "w") -> str:
    """A window's length in seconds, at least a millisecond (so a zero-length window still weighs)."""
    return store.greatest_sql(store.seconds_sql(f"{alias}.window_start", f"{alias}.window_end"), "0.001")


def rollup_insert_sql(store: SqlDialect, source: str, where: str) -> str:
    """INSERT ... SELECT summing the windows of ``source`` (a table or CTE, aliased w) that match ``where``
    into rollups, merging into buckets that already exist. Needs :bucket_s (and what ``where`` uses)."""
    dur = window_seconds_sql(store)
    bucket = store.bucket_sql("w.window_start", "bucket_s")
    columns = ["fleet", "device", "bundle_id", "bucket_start", "bucket_s"] + [name for name, _ in ROLLUP_FROM_RAW]
    selects = ["w.fleet", "w.device", "COALESCE(w.bundle_id, '')", bucket, ":bucket_s"]
    selects += [expression.format(dur=dur) for _, expression in ROLLUP_FROM_RAW]
    merges = []
    for name, _ in ROLLUP_FROM_RAW:
        old, new = f"telemetry_rollups.{name}", f"excluded.{name}"
        if name in _MAX_MERGED:
            merges.append(f"{name} = {store.greatest_sql(old, new)}")
        elif name in _MIN_MERGED:
            merges.append(f"{name} = {store.least_sql(old, new)}")
        elif name in _NULLABLE_SUMS:
            merges.append(f"{name} = CASE WHEN {old} IS NULL THEN {new} WHEN {new} IS NULL THEN {old} "
                          f"ELSE {old} + {new} END")  # fmt: skip
        else:
            merges.append(f"{name} = {old} + {new}")
    return (f"INSERT INTO telemetry_rollups ({', '.join(columns)})\n"
            f"SELECT {', '.join(selects)}\nFROM {source} WHERE {where}\nGROUP BY 1, 2, 3, 4\n"
            f"ON CONFLICT (fleet, device, bundle_id, bucket_s, bucket_start) DO UPDATE SET {', '.join(merges)}")  # fmt: skip


def device_filter(store: SqlDialect, alias: str, params: dict[str, Any],
                  devices: Sequence[tuple[str, str]]) -> str:
    """``fleet = :f AND device IN (...)`` per fleet: plain column filters, so the (fleet, device, time) indexes apply."""
    by_fleet: dict[str, list[str]] = {}
    for fleet_id, device in devices:
        by_fleet.setdefault(fleet_id, []).append(device)
    if not by_fleet:
        return "1 = 0"
    parts: list[str] = []
    for index, (fleet_id, names) in enumerate(sorted(by_fleet.items())):
        params[f"device_fleet_{index}"] = fleet_id
        if len(names) == 1:
            params[f"device_{index}"] = names[0]
            parts.append(f"({alias}.fleet = :device_fleet_{index} AND {alias}.device = :device_{index})")
        else:
            params[f"devices_{index}"] = store.list_in(names)
            parts.append(f"({alias}.fleet = :device_fleet_{index} AND "
                         f"{store.in_list_sql(f'{alias}.device', f'devices_{index}')})")  # fmt: skip
    return parts[0] if len(parts) == 1 else "(" + " OR ".join(parts) + ")"


def _filters(store: SqlDialect, alias: str, time_column: str, params: dict[str, Any], *, fleet: str | None,
             devices: Sequence[tuple[str, str]] | None, bundle_id: str | None, since: dt.datetime | None,
             until: dt.datetime | None) -> str:  # fmt: skip
    clauses = ["1 = 1"]
    if fleet is not None:
        clauses.append(f"{alias}.fleet = :fleet")
        params["fleet"] = fleet
    if devices is not None:
        clauses.append(device_filter(store, alias, params, devices))
    if bundle_id is not None:
        clauses.append(f"{alias}.bundle_id = :bundle_id")
        params["bundle_id"] = bundle_id
    if since is not None:
        clauses.append(f"{alias}.{time_column} >= :since")
        params["since"] = store.time_in(since)
    if until is not None:
        clauses.append(f"{alias}.{time_column} < :until")
        params["until"] = store.time_in(until)
    return " AND ".join(clauses)


def union_sql(store: SqlDialect, params: dict[str, Any], *, power_mode: bool = False, **filters: Any) -> str:
    """Raw windows (filtered on window_end) and rollups (on bucket_start) as rows of the same sums; with
    ``power_mode`` a raw window's column holds the mode it was measured in (telemetry.v1 ``power_mode``),
    else (and for rollups, which do not keep it) NULL."""
    dur = window_seconds_sql(store)
    mode = store.json_text_sql("w.payload", "power_mode") if power_mode else "NULL"
    raw_where = _filters(store, "w", "window_end", params, **filters)
    rolled_where = _filters(store, "r", "bucket_start", params, **filters)
    return f"""SELECT w.fleet, w.device, w.bundle_id, w.window_start AS t_start, w.window_end AS t_end, 1 AS windows,
    w.inferences, w.errors, CASE WHEN w.p50_ms IS NULL THEN 0 ELSE w.inferences END AS latency_count,
    COALESCE(w.p50_ms * w.inferences, 0.0) AS p50_sum, COALESCE(w.p99_ms * w.inferences, 0.0) AS p99_sum,
    w.p99_ms AS p99_max_ms, CASE WHEN w.power_mean_mw IS NULL THEN 0.0 ELSE {dur} END AS power_s,
    COALESCE(w.power_mean_mw * {dur}, 0.0) AS power_mw_s, w.energy_mj,
    CASE WHEN w.inferences > 0 THEN w.energy_mj END AS energy_active_mj,
    CASE WHEN w.inferences > 0 AND w.energy_mj IS NOT NULL THEN w.inferences ELSE 0 END AS energy_count,
    w.temperature_max_c, {mode} AS power_mode
FROM telemetry_windows w WHERE {raw_where}
UNION ALL
SELECT r.fleet, r.device, NULLIF(r.bundle_id, ''), r.window_start_min, r.window_end_max, r.windows, r.inferences,
    r.errors, r.latency_count, r.p50_sum, r.p99_sum, r.p99_max_ms, r.power_s, r.power_mw_s, r.energy_mj,
    r.energy_active_mj, r.energy_count, r.temperature_max_c, NULL
FROM telemetry_rollups r WHERE {rolled_where}"""


#: power_mode: the window's own (raw windows of agents that report it), else the device's latest reported one
_KEY_COLUMNS = {"fleet": "u.fleet", "device": "u.device", "bundle_id": "u.bundle_id", "target": "t.target",
                "power_mode": "COALESCE(u.power_mode, i.power_mode)"}


def aggregate_sql(store: SqlDialect, keys: Sequence[str], params: dict[str, Any], *, target: str | None,
                  bucket_s: int | None, **filters: Any) -> str:  # fmt: skip
    """Columns: fleet, device, bundle_id, target, power_mode (NULL unless grouped), bucket_start, devices, windows,
    inferences, errors, p50_ms, p99_ms, p99_max_ms, power_mean_mw, energy_mj, energy_per_inference_mj,
    temperature_max_c, first_window_start, last_window_end."""
    union = union_sql(store, params, power_mode="power_mode" in keys, **filters)
    selected = [_KEY_COLUMNS[key] if key in keys else "NULL" for key in _KEY_COLUMNS]
    # by position: PostgreSQL would not match a bucket expression holding a parameter in GROUP BY
    groups = [str(index + 1) for index, key in enumerate(_KEY_COLUMNS) if key in keys]
    if bucket_s is not None:
        params["agg_bucket_s"] = bucket_s
        selected.append(store.bucket_sql("u.t_start", "agg_bucket_s"))
        groups.append(str(len(_KEY_COLUMNS) + 1))
    else:
        selected.append("NULL")
    where = ""
    if target is not None:
        where = "WHERE t.target = :target"
        params["target"] = target
    group_by = f"GROUP BY {', '.join(groups)} ORDER BY {', '.join(groups)}" if groups else ""
    return f"""SELECT {', '.join(selected)}, COUNT(DISTINCT u.fleet || '/' || u.device), SUM(u.windows),
    SUM(u.inferences), SUM(u.errors), SUM(u.p50_sum) / NULLIF(SUM(u.latency_count), 0),
    SUM(u.p99_sum) / NULLIF(SUM(u.latency_count), 0), MAX(u.p99_max_ms), SUM(u.power_mw_s) / NULLIF(SUM(u.power_s), 0),
    SUM(u.energy_mj), SUM(u.energy_active_mj) / NULLIF(SUM(u.energy_count), 0), MAX(u.temperature_max_c),
    MIN(u.t_start), MAX(u.t_end)
FROM ({union}) u LEFT JOIN device_targets t ON t.fleet = u.fleet AND t.device = u.device
LEFT JOIN device_identity i ON i.fleet = u.fleet AND i.device = u.device
{where} {group_by}"""


def bundle_spans_sql(store: SqlDialect, params: dict[str, Any], *, fleet: str | None, since: dt.datetime | None,
                     until: dt.datetime | None) -> str:  # fmt: skip
    """Per device and bundle its first and last window over all history (device_bundles, kept as windows arrive),
    for the pairs with a window in [since, until)."""
    clauses = ["1 = 1"]
    for clause, name, value in (("b.fleet = :fleet", "fleet", fleet), ("b.window_end_max >= :since", "since", since),
                                ("b.window_start_min < :until", "until", until)):  # fmt: skip
        if value is not None:
            clauses.append(clause)
            params[name] = value if name == "fleet" else store.time_in(value)
    return f"""SELECT b.fleet, b.device, b.bundle_id, b.window_start_min, b.window_end_max, b.windows FROM device_bundles b
WHERE {' AND '.join(clauses)} ORDER BY b.fleet, b.device, b.window_start_min"""


#: The figures of :class:`Aggregate` from device_bundles rows (``{where}`` picks the devices; :bundle_id).
BUNDLE_TOTALS = """SELECT COUNT(*), SUM(b.windows), SUM(b.inferences), SUM(b.errors),
    SUM(b.p50_sum) / NULLIF(SUM(b.latency_count), 0), SUM(b.p99_sum) / NULLIF(SUM(b.latency_count), 0), MAX(b.p99_max_ms),
    SUM(b.power_mw_s) / NULLIF(SUM(b.power_s), 0), SUM(b.energy_mj), SUM(b.energy_active_mj) / NULLIF(SUM(b.energy_count), 0),
    MAX(b.temperature_max_c), MIN(b.window_start_min), MAX(b.window_end_max)
FROM device_bundles b WHERE {where} AND b.bundle_id = :bundle_id"""


# -- per model (issue 20) ---------------------------------------------------------------------------------------
#: A multi-row insert of model windows: head and tail (SqlFleetStore.execute_rows writes the rows between).
INSERT_MODEL_WINDOW = """INSERT INTO telemetry_model_windows (fleet, device, seq, model, bundle_id, window_start,
    window_end, inferences, errors, p50_ms, p99_ms, throughput_per_s, memory_mb) VALUES"""
INSERT_MODEL_WINDOW_END = "ON CONFLICT (fleet, device, seq, model) DO NOTHING"

#: Model rollup columns and how model windows (alias ``w``) sum into them, and how an existing bucket merges.
MODEL_ROLLUP_FROM_RAW: tuple[tuple[str, str, str], ...] = (
    ("windows", "COUNT(*)", "sum"),
    ("inferences", "SUM(w.inferences)", "sum"),
    ("errors", "SUM(w.errors)", "sum"),
    ("latency_count", "SUM(CASE WHEN w.p50_ms IS NULL THEN 0 ELSE w.inferences END)", "sum"),
    ("p50_sum", "SUM(COALESCE(w.p50_ms * w.inferences, 0.0))", "sum"),
    ("p99_sum", "SUM(COALESCE(w.p99_ms * w.inferences, 0.0))", "sum"),
    ("p99_max_ms", "MAX(w.p99_ms)", "max"),
    ("memory_mb_max", "MAX(w.memory_mb)", "max"),
    ("window_start_min", "MIN(w.window_start)", "min"),
    ("window_end_max", "MAX(w.window_end)", "max"),
)


def model_rollup_insert_sql(store: SqlDialect, source: str, where: str) -> str:
    """INSERT ... SELECT summing the model windows of ``source`` (aliased w) matching ``where`` into model
    rollups, merging into buckets that already exist. Needs :bucket_s."""
    bucket = store.bucket_sql("w.window_start", "bucket_s")
    columns = ["fleet", "device", "model", "bundle_id", "bucket_start", "bucket_s"] + [c[0] for c in MODEL_ROLLUP_FROM_RAW]
    selects = ["w.fleet", "w.device", "w.model", "COALESCE(w.bundle_id, '')", bucket, ":bucket_s"]
    selects += [expression for _, expression, _ in MODEL_ROLLUP_FROM_RAW]
    merges = []
    for name, _, how in MODEL_ROLLUP_FROM_RAW:
        old, new = f"telemetry_model_rollups.{name}", f"excluded.{name}"
        merged = {"sum": f"{old} + {new}", "max": store.greatest_sql(old, new), "min": store.least_sql(old, new)}[how]
        merges.append(f"{name} = {merged}")
    return (f"INSERT INTO telemetry_model_rollups ({', '.join(columns)})\n"
            f"SELECT {', '.join(selects)}\nFROM {source} WHERE {where}\nGROUP BY 1, 2, 3, 4, 5\n"
            f"ON CONFLICT (fleet, device, model, bundle_id, bucket_s, bucket_start) DO UPDATE SET {', '.join(merges)}")  # fmt: skip


_MODEL_KEY_COLUMNS = {"fleet": "u.fleet", "device": "u.device", "model": "u.model", "bundle_id": "u.bundle_id"}


def model_aggregate_sql(store: SqlDialect, keys: Sequence[str], params: dict[str, Any], *, fleet: str | None,
                        devices: Sequence[tuple[str, str]] | None, model: str | None, since: dt.datetime | None,
                        until: dt.datetime | None, bucket_s: int | None) -> str:  # fmt: skip
    """Columns: fleet, device, model, bundle_id (NULL unless grouped; model and bundle '' for none), bucket_start,
    devices, windows, inferences, errors, p50_ms, p99_ms, p99_max_ms, throughput_per_s, memory_mb_max,
    first_window_start, last_window_end. Raw model windows are filtered on window_end, rollups on bucket_start."""
    filters: dict[str, Any] = {"fleet": fleet, "devices": devices, "bundle_id": None, "since": since, "until": until}
    raw_where = _filters(store, "w", "window_end", params, **filters)
    rolled_where = _filters(store, "r", "bucket_start", params, **filters)
    if model is not None:
        params["model"] = model
        raw_where += " AND w.model = :model"
        rolled_where += " AND r.model = :model"
    dur = window_seconds_sql(store)
    union = f"""SELECT w.fleet, w.device, w.model, COALESCE(w.bundle_id, '') AS bundle_id, w.window_start AS t_start,
    w.window_end AS t_end, 1 AS windows, w.inferences, w.errors,
    CASE WHEN w.p50_ms IS NULL THEN 0 ELSE w.inferences END AS latency_count,
    COALESCE(w.p50_ms * w.inferences, 0.0) AS p50_sum, COALESCE(w.p99_ms * w.inferences, 0.0) AS p99_sum,
    w.p99_ms AS p99_max_ms, w.memory_mb AS memory_mb_max, {dur} AS seconds
FROM telemetry_model_windows w WHERE {raw_where}
UNION ALL
SELECT r.fleet, r.device, r.model, r.bundle_id, r.window_start_min, r.window_end_max, r.windows, r.inferences,
    r.errors, r.latency_count, r.p50_sum, r.p99_sum, r.p99_max_ms, r.memory_mb_max,
    {store.greatest_sql(store.seconds_sql('r.window_start_min', 'r.window_end_max'), '0.001')}
FROM telemetry_model_rollups r WHERE {rolled_where}"""
    selected = [_MODEL_KEY_COLUMNS[key] if key in keys else "NULL" for key in _MODEL_KEY_COLUMNS]
    groups = [str(index + 1) for index, key in enumerate(_MODEL_KEY_COLUMNS) if key in keys]
    if bucket_s is not None:
        params["agg_bucket_s"] = bucket_s
        selected.append(store.bucket_sql("u.t_start", "agg_bucket_s"))
        groups.append(str(len(_MODEL_KEY_COLUMNS) + 1))
    else:
        selected.append("NULL")
    group_by = f"GROUP BY {', '.join(groups)} ORDER BY {', '.join(groups)}" if groups else ""
    # throughput: inferences per second of window, i.e. per device (the mean over its windows)
    return f"""SELECT {', '.join(selected)}, COUNT(DISTINCT u.fleet || '/' || u.device), SUM(u.windows),
    SUM(u.inferences), SUM(u.errors), SUM(u.p50_sum) / NULLIF(SUM(u.latency_count), 0),
    SUM(u.p99_sum) / NULLIF(SUM(u.latency_count), 0), MAX(u.p99_max_ms),
    SUM(u.inferences) / NULLIF(SUM(u.seconds), 0),
    MAX(u.memory_mb_max), MIN(u.t_start), MAX(u.t_end)
FROM ({union}) u {group_by}"""


def upsert_retained_status_sql(store: SqlDialect) -> str:
    """:data:`UPSERT_STATUS` for a status the broker sent again (MQTT retained) to a collector subscribing: it is the
    device's newest (the broker keeps one a device), so its state is taken whatever its time; but it was said at its
    ``updated_at`` or before, so a later heard-from time already stored is kept (a restart revives no one), unless it
    is later than the last parameter (from a clock set back since)."""
    insert = UPSERT_STATUS[:UPSERT_STATUS.index("ON CONFLICT")]
    return (f"{insert}ON CONFLICT (fleet, device) DO UPDATE SET state = excluded.state, bundle_id = excluded.bundle_id, "
            f"agent_version = excluded.agent_version, payload = excluded.payload, "
            f"updated_at = CASE WHEN device_status.updated_at > ? THEN excluded.updated_at "
            f"ELSE {store.greatest_sql('device_status.updated_at', 'excluded.updated_at')} END")  # fmt: skip


def event_filters(fleet: str | None, device: str | None, kinds: Sequence[str]) -> tuple[list[str], dict[str, Any]]:
    """WHERE clauses (``:name`` placeholders) and parameters of a device-event read: of one fleet, one device, some
    kinds (each optional; no kinds: every kind)."""
    clauses: list[str] = []
    params: dict[str, Any] = {}
    for column, value in (("fleet", fleet), ("device", device)):
        if value is not None:
            clauses.append(f"{column} = :{column}")
            params[column] = value
    chosen = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    if chosen:
        clauses.append(f"kind IN ({', '.join(f':kind_{index}' for index in range(len(chosen)))})")
        params.update({f"kind_{index}": kind for index, kind in enumerate(chosen)})
    return clauses, params


__all__ = ["aggregate_sql", "event_filters", "upsert_retained_status_sql", "bundle_spans_sql", "model_aggregate_sql", "model_rollup_insert_sql", "rollup_insert_sql", "union_sql",
           "window_seconds_sql"]
