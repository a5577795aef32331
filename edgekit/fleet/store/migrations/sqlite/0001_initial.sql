-- edgekit fleet store, SQLite, version 1: telemetry windows and their rollups, device status and
-- targets, events, rejected messages. Times are seconds since the Unix epoch (UTC) as REAL.

CREATE TABLE telemetry_windows (
    fleet TEXT NOT NULL,
    device TEXT NOT NULL,
    seq INTEGER NOT NULL,
    window_start REAL NOT NULL,
    window_end REAL NOT NULL,
    received_at REAL NOT NULL,
    bundle_id TEXT,
    bundle_sha256 TEXT,
    inferences INTEGER NOT NULL,
    errors INTEGER NOT NULL,
    p50_ms REAL,
    p90_ms REAL,
    p99_ms REAL,
    max_ms REAL,
    mean_ms REAL,
    throughput_per_s REAL,
    power_mean_mw REAL,
    power_max_mw REAL,
    energy_mj REAL,
    energy_per_inference_mj REAL,
    temperature_max_c REAL,
    memory_used_mb REAL,
    cpu_load_pct REAL,
    gpu_load_pct REAL,
    payload TEXT NOT NULL,
    PRIMARY KEY (fleet, device, seq)
);
CREATE INDEX telemetry_windows_by_end ON telemetry_windows (window_end);

-- Raw windows past the retention time, summed per device, bundle ('' for none) and time bucket.
-- Means are kept as weighted sums so that buckets merge exactly.
CREATE TABLE telemetry_rollups (
    fleet TEXT NOT NULL,
    device TEXT NOT NULL,
    bundle_id TEXT NOT NULL,
    bucket_start REAL NOT NULL,
    bucket_s INTEGER NOT NULL,
    windows INTEGER NOT NULL,
    inferences INTEGER NOT NULL,
    errors INTEGER NOT NULL,
    latency_count INTEGER NOT NULL,   -- inferences of the windows with latency figures
    p50_sum REAL NOT NULL,            -- sum of p50_ms * inferences
    p90_sum REAL NOT NULL,
    p99_sum REAL NOT NULL,
    mean_sum REAL NOT NULL,
    p99_max_ms REAL,
    max_ms REAL,
    power_s REAL NOT NULL,            -- seconds of windows with a power reading
    power_mw_s REAL NOT NULL,         -- sum of power_mean_mw * window seconds
    power_max_mw REAL,
    energy_mj REAL,                   -- all energy measured
    energy_active_mj REAL,            -- energy of the windows with inferences
    energy_count INTEGER NOT NULL,    -- inferences of the windows with an energy reading
    temperature_max_c REAL,
    memory_used_mb_max REAL,
    seq_min INTEGER NOT NULL,
    seq_max INTEGER NOT NULL,
    window_start_min REAL NOT NULL,
    window_end_max REAL NOT NULL,
    received_at_max REAL NOT NULL,
    PRIMARY KEY (fleet, device, bundle_id, bucket_s, bucket_start)
);
CREATE INDEX telemetry_rollups_by_start ON telemetry_rollups (bucket_start);

CREATE TABLE device_status (
    fleet TEXT NOT NULL,
    device TEXT NOT NULL,
    state TEXT NOT NULL,
    bundle_id TEXT,
    agent_version TEXT,
    updated_at REAL NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (fleet, device)
);

CREATE TABLE device_targets (
    fleet TEXT NOT NULL,
    device TEXT NOT NULL,
    target TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (fleet, device)
);

CREATE TABLE device_events (
    event_id TEXT PRIMARY KEY,
    fleet TEXT NOT NULL,
    device TEXT NOT NULL,
    kind TEXT NOT NULL,
    level TEXT NOT NULL,
    message TEXT NOT NULL,
    at REAL NOT NULL,
    command_id TEXT,
    payload TEXT NOT NULL
);
CREATE INDEX device_events_by_device ON device_events (fleet, device, at);
CREATE INDEX device_events_by_time ON device_events (at);

CREATE TABLE rejected_messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    reason TEXT NOT NULL,
    detail TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX rejected_messages_by_time ON rejected_messages (at);

-- Counts survive the retention that deletes old rejected_messages rows.
CREATE TABLE rejected_totals (
    reason TEXT PRIMARY KEY,
    count INTEGER NOT NULL
);
