-- edgekit fleet store, SQLite, version 7: aggregates kept as windows arrive (issue 27), so that no read scans raw
-- windows across the fleet. Written by FleetStore.add_windows in the same transaction as the windows themselves
-- (edgekit/fleet/store/buckets.py):
--   device_latest        one row per device: totals over its whole history, its newest window, and the marks that
--                        tell whether a window is the device's first in a fleet bucket (for the devices counts);
--   fleet_buckets        per fleet, bundle, target and power mode (as known when the window arrived) and 1-minute and
--                        1-hour bucket: the sums telemetry_rollups keeps per device, plus the devices reporting;
--   fleet_model_buckets  the same per fleet, model and bundle;
--   device_bundles       per device and bundle: its first and last window and its sums (the report's bundle
--                        switches and their before/after comparisons).
-- Windows stored before this version are summed in when the store opens.

CREATE TABLE IF NOT EXISTS device_latest (
    fleet TEXT NOT NULL,
    device TEXT NOT NULL,
    windows INTEGER NOT NULL DEFAULT 0,      -- every window stored, raw or rolled up since
    seq_min INTEGER,
    seq_max INTEGER,
    received_at_max REAL,
    window_end_max REAL,
    latest_seq INTEGER,                     -- the newest window (highest seq) and its figures
    bundle_id TEXT,
    p50_ms REAL,
    p99_ms REAL,
    power_mean_mw REAL,
    energy_per_inference_mj REAL,
    temperature_max_c REAL,
    interval_s REAL,                        -- its length: the device's telemetry interval
    marks TEXT NOT NULL DEFAULT '{}',       -- JSON: bucket tier -> [group, bucket start] of the newest window counted
    PRIMARY KEY (fleet, device)
);

CREATE TABLE IF NOT EXISTS fleet_buckets (
    fleet TEXT NOT NULL,
    bundle_id TEXT NOT NULL,                -- '' for none
    target TEXT NOT NULL,                   -- '' when unknown
    power_mode TEXT NOT NULL,               -- '' when not reported
    bucket_s INTEGER NOT NULL,              -- 60 or 3600
    bucket_start REAL NOT NULL,
    devices INTEGER NOT NULL,               -- devices with a window in the bucket
    windows INTEGER NOT NULL,
    inferences INTEGER NOT NULL,
    errors INTEGER NOT NULL,
    latency_count INTEGER NOT NULL,
    p50_sum REAL NOT NULL,
    p99_sum REAL NOT NULL,
    p99_max_ms REAL,
    power_s REAL NOT NULL,
    power_mw_s REAL NOT NULL,
    energy_mj REAL,
    energy_active_mj REAL,
    energy_count INTEGER NOT NULL,
    temperature_max_c REAL,
    window_start_min REAL NOT NULL,
    window_end_max REAL NOT NULL,
    PRIMARY KEY (bucket_s, bucket_start, fleet, bundle_id, target, power_mode)
);

CREATE TABLE IF NOT EXISTS fleet_model_buckets (
    fleet TEXT NOT NULL,
    model TEXT NOT NULL,
    bundle_id TEXT NOT NULL,
    bucket_s INTEGER NOT NULL,
    bucket_start REAL NOT NULL,
    devices INTEGER NOT NULL,
    windows INTEGER NOT NULL,
    inferences INTEGER NOT NULL,
    errors INTEGER NOT NULL,
    latency_count INTEGER NOT NULL,
    p50_sum REAL NOT NULL,
    p99_sum REAL NOT NULL,
    p99_max_ms REAL,
    memory_mb_max REAL,
    seconds REAL NOT NULL,                  -- window seconds, for inferences per second
    window_start_min REAL NOT NULL,
    window_end_max REAL NOT NULL,
    PRIMARY KEY (bucket_s, bucket_start, fleet, model, bundle_id)
);

CREATE TABLE IF NOT EXISTS device_bundles (
    fleet TEXT NOT NULL,
    device TEXT NOT NULL,
    bundle_id TEXT NOT NULL,
    window_start_min REAL NOT NULL,
    window_end_max REAL NOT NULL,
    windows INTEGER NOT NULL,
    inferences INTEGER NOT NULL,           -- the sums fleet_buckets keeps, over all the device's windows on the bundle
    errors INTEGER NOT NULL,
    latency_count INTEGER NOT NULL,
    p50_sum REAL NOT NULL,
    p99_sum REAL NOT NULL,
    p99_max_ms REAL,
    power_s REAL NOT NULL,
    power_mw_s REAL NOT NULL,
    energy_mj REAL,
    energy_active_mj REAL,
    energy_count INTEGER NOT NULL,
    temperature_max_c REAL,
    PRIMARY KEY (fleet, device, bundle_id)
);
CREATE INDEX IF NOT EXISTS device_bundles_by_end ON device_bundles (window_end_max);

-- A store taken back to an older version applies this again: the sums are made anew from what it keeps.
DELETE FROM device_latest;
DELETE FROM fleet_buckets;
DELETE FROM fleet_model_buckets;
DELETE FROM device_bundles;
