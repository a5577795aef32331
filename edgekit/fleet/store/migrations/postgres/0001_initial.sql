-- edgekit fleet store, PostgreSQL, version 1: telemetry windows and their rollups, device status and
-- targets, events, rejected messages. For TimescaleDB, see docs/fleet.md.

CREATE TABLE telemetry_windows (
    fleet TEXT NOT NULL,
    device TEXT NOT NULL,
    seq BIGINT NOT NULL,
    window_start TIMESTAMPTZ NOT NULL,
    window_end TIMESTAMPTZ NOT NULL,
    received_at TIMESTAMPTZ NOT NULL,
    bundle_id TEXT,
    bundle_sha256 TEXT,
    inferences BIGINT NOT NULL,
    errors BIGINT NOT NULL,
    p50_ms DOUBLE PRECISION,
    p90_ms DOUBLE PRECISION,
    p99_ms DOUBLE PRECISION,
    max_ms DOUBLE PRECISION,
    mean_ms DOUBLE PRECISION,
    throughput_per_s DOUBLE PRECISION,
    power_mean_mw DOUBLE PRECISION,
    power_max_mw DOUBLE PRECISION,
    energy_mj DOUBLE PRECISION,
    energy_per_inference_mj DOUBLE PRECISION,
    temperature_max_c DOUBLE PRECISION,
    memory_used_mb DOUBLE PRECISION,
    cpu_load_pct DOUBLE PRECISION,
    gpu_load_pct DOUBLE PRECISION,
    payload JSONB NOT NULL,
    PRIMARY KEY (fleet, device, seq)
);
CREATE INDEX telemetry_windows_by_end ON telemetry_windows (window_end);

-- Raw windows past the retention time, summed per device, bundle ('' for none) and time bucket.
-- Means are kept as weighted sums so that buckets merge exactly.
CREATE TABLE telemetry_rollups (
    fleet TEXT NOT NULL,
    device TEXT NOT NULL,
    bundle_id TEXT NOT NULL,
    bucket_start TIMESTAMPTZ NOT NULL,
    bucket_s BIGINT NOT NULL,
    windows BIGINT NOT NULL,
    inferences BIGINT NOT NULL,
    errors BIGINT NOT NULL,
    latency_count BIGINT NOT NULL,  -- inferences of the windows with latency figures
    p50_sum DOUBLE PRECISION NOT NULL,  -- sum of p50_ms * inferences
    p90_sum DOUBLE PRECISION NOT NULL,
    p99_sum DOUBLE PRECISION NOT NULL,
    mean_sum DOUBLE PRECISION NOT NULL,
    p99_max_ms DOUBLE PRECISION,
    max_ms DOUBLE PRECISION,
    power_s DOUBLE PRECISION NOT NULL,  -- seconds of windows with a power reading
    power_mw_s DOUBLE PRECISION NOT NULL,  -- sum of power_mean_mw * window seconds
    power_max_mw DOUBLE PRECISION,
    energy_mj DOUBLE PRECISION,  -- all energy measured
    energy_active_mj DOUBLE PRECISION,  -- energy of the windows with inferences
    energy_count BIGINT NOT NULL,  -- inferences of the windows with an energy reading
    temperature_max_c DOUBLE PRECISION,
    memory_used_mb_max DOUBLE PRECISION,
    seq_min BIGINT NOT NULL,
    seq_max BIGINT NOT NULL,
    window_start_min TIMESTAMPTZ NOT NULL,
    window_end_max TIMESTAMPTZ NOT NULL,
    received_at_max TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (fleet, device, bundle_id, bucket_s, bucket_start)
);
CREATE INDEX telemetry_rollups_by_start ON telemetry_rollups (bucket_start);

CREATE TABLE device_status (
    fleet TEXT NOT NULL,
    device TEXT NOT NULL,
    state TEXT NOT NULL,
    bundle_id TEXT,
    agent_version TEXT,
    updated_at TIMESTAMPTZ NOT NULL,
    payload JSONB NOT NULL,
    PRIMARY KEY (fleet, device)
);

CREATE TABLE device_targets (
    fleet TEXT NOT NULL,
    device TEXT NOT NULL,
    target TEXT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (fleet, device)
);

CREATE TABLE device_events (
    event_id TEXT PRIMARY KEY,
    fleet TEXT NOT NULL,
    device TEXT NOT NULL,
    kind TEXT NOT NULL,
    level TEXT NOT NULL,
    message TEXT NOT NULL,
    at TIMESTAMPTZ NOT NULL,
    command_id TEXT,
    payload JSONB NOT NULL
);
CREATE INDEX device_events_by_device ON device_events (fleet, device, at);
CREATE INDEX device_events_by_time ON device_events (at);

CREATE TABLE rejected_messages (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic TEXT NOT NULL,
    reason TEXT NOT NULL,
    detail TEXT NOT NULL,
    size_bytes BIGINT NOT NULL,
    at TIMESTAMPTZ NOT NULL
);
CREATE INDEX rejected_messages_by_time ON rejected_messages (at);

-- Counts survive the retention that deletes old rejected_messages rows.
CREATE TABLE rejected_totals (
    reason TEXT PRIMARY KEY,
    count BIGINT NOT NULL
);
