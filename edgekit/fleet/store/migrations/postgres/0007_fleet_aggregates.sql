-- edgekit fleet store, PostgreSQL, version 7: aggregates kept as windows arrive (issue 27), so that no read scans
-- raw windows across the fleet; see the SQLite file of the same version for what each table holds. Written by
-- FleetStore.add_windows in the windows' own transaction (edgekit/fleet/store/buckets.py); windows stored before
-- this version are summed in when the store opens.

CREATE TABLE IF NOT EXISTS device_latest (
    fleet TEXT NOT NULL,
    device TEXT NOT NULL,
    windows BIGINT NOT NULL DEFAULT 0,
    seq_min BIGINT,
    seq_max BIGINT,
    received_at_max TIMESTAMPTZ,
    window_end_max TIMESTAMPTZ,
    latest_seq BIGINT,
    bundle_id TEXT,
    p50_ms DOUBLE PRECISION,
    p99_ms DOUBLE PRECISION,
    power_mean_mw DOUBLE PRECISION,
    energy_per_inference_mj DOUBLE PRECISION,
    temperature_max_c DOUBLE PRECISION,
    interval_s DOUBLE PRECISION,
    marks TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (fleet, device)
);

CREATE TABLE IF NOT EXISTS fleet_buckets (
    fleet TEXT NOT NULL,
    bundle_id TEXT NOT NULL,
    target TEXT NOT NULL,
    power_mode TEXT NOT NULL,
    bucket_s INTEGER NOT NULL,
    bucket_start TIMESTAMPTZ NOT NULL,
    devices BIGINT NOT NULL,
    windows BIGINT NOT NULL,
    inferences BIGINT NOT NULL,
    errors BIGINT NOT NULL,
    latency_count BIGINT NOT NULL,
    p50_sum DOUBLE PRECISION NOT NULL,
    p99_sum DOUBLE PRECISION NOT NULL,
    p99_max_ms DOUBLE PRECISION,
    power_s DOUBLE PRECISION NOT NULL,
    power_mw_s DOUBLE PRECISION NOT NULL,
    energy_mj DOUBLE PRECISION,
    energy_active_mj DOUBLE PRECISION,
    energy_count BIGINT NOT NULL,
    temperature_max_c DOUBLE PRECISION,
    window_start_min TIMESTAMPTZ NOT NULL,
    window_end_max TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (bucket_s, bucket_start, fleet, bundle_id, target, power_mode)
);

CREATE TABLE IF NOT EXISTS fleet_model_buckets (
    fleet TEXT NOT NULL,
    model TEXT NOT NULL,
    bundle_id TEXT NOT NULL,
    bucket_s INTEGER NOT NULL,
    bucket_start TIMESTAMPTZ NOT NULL,
    devices BIGINT NOT NULL,
    windows BIGINT NOT NULL,
    inferences BIGINT NOT NULL,
    errors BIGINT NOT NULL,
    latency_count BIGINT NOT NULL,
    p50_sum DOUBLE PRECISION NOT NULL,
    p99_sum DOUBLE PRECISION NOT NULL,
    p99_max_ms DOUBLE PRECISION,
    memory_mb_max DOUBLE PRECISION,
    seconds DOUBLE PRECISION NOT NULL,
    window_start_min TIMESTAMPTZ NOT NULL,
    window_end_max TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (bucket_s, bucket_start, fleet, model, bundle_id)
);

CREATE TABLE IF NOT EXISTS device_bundles (
    fleet TEXT NOT NULL,
    device TEXT NOT NULL,
    bundle_id TEXT NOT NULL,
    window_start_min TIMESTAMPTZ NOT NULL,
    window_end_max TIMESTAMPTZ NOT NULL,
    windows BIGINT NOT NULL,
    inferences BIGINT NOT NULL,           -- the sums fleet_buckets keeps, over all the device's windows on the bundle
    errors BIGINT NOT NULL,
    latency_count BIGINT NOT NULL,
    p50_sum DOUBLE PRECISION NOT NULL,
    p99_sum DOUBLE PRECISION NOT NULL,
    p99_max_ms DOUBLE PRECISION,
    power_s DOUBLE PRECISION NOT NULL,
    power_mw_s DOUBLE PRECISION NOT NULL,
    energy_mj DOUBLE PRECISION,
    energy_active_mj DOUBLE PRECISION,
    energy_count BIGINT NOT NULL,
    temperature_max_c DOUBLE PRECISION,
    PRIMARY KEY (fleet, device, bundle_id)
);
CREATE INDEX IF NOT EXISTS device_bundles_by_end ON device_bundles (window_end_max);

-- device_latest and device_bundles are rewritten by every batch that holds their device: room on each page lets
-- PostgreSQL update them in place (HOT, no index change) and prune old versions without waiting for VACUUM,
-- which the collectors' steady rewrites would otherwise outrun (measured: 584 MB and 1.5 M dead rows for 10,000
-- devices after 1.7 M windows seeded in 40 minutes).
ALTER TABLE device_latest SET (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE device_bundles SET (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE fleet_buckets SET (fillfactor = 70);
ALTER TABLE fleet_model_buckets SET (fillfactor = 70);

-- A store taken back to an older version applies this again: the sums are made anew from what it keeps.
DELETE FROM device_latest;
DELETE FROM fleet_buckets;
DELETE FROM fleet_model_buckets;
DELETE FROM device_bundles;
