-- edgekit fleet store, PostgreSQL, version 6: telemetry per model (issue 20). An agent serving a model repository
-- names the model of each window (telemetry.v1 "model") and lists every model's own window ("models": count,
-- errors, p50, p99, throughput, bundle). telemetry_model_windows holds one row per model and window (model '' for windows of agents that name none), summed by retention into
-- telemetry_model_rollups as the device-wide windows are into telemetry_rollups. (A window's own model stays in
-- its payload.) Written to run again harmlessly: a store taken back to an older version re-applies it.

CREATE TABLE IF NOT EXISTS telemetry_model_windows (
    fleet TEXT NOT NULL,
    device TEXT NOT NULL,
    seq BIGINT NOT NULL,
    model TEXT NOT NULL,              -- '' when the agent named no model
    bundle_id TEXT,
    window_start TIMESTAMPTZ NOT NULL,
    window_end TIMESTAMPTZ NOT NULL,
    inferences BIGINT NOT NULL,
    errors BIGINT NOT NULL,
    p50_ms DOUBLE PRECISION,
    p99_ms DOUBLE PRECISION,
    throughput_per_s DOUBLE PRECISION,
    memory_mb DOUBLE PRECISION,
    PRIMARY KEY (fleet, device, seq, model)
);
CREATE INDEX IF NOT EXISTS telemetry_model_windows_by_end ON telemetry_model_windows (window_end);

-- Model windows past the retention time, summed per device, model, bundle ('' for none) and time bucket.
CREATE TABLE IF NOT EXISTS telemetry_model_rollups (
    fleet TEXT NOT NULL,
    device TEXT NOT NULL,
    model TEXT NOT NULL,
    bundle_id TEXT NOT NULL,
    bucket_start TIMESTAMPTZ NOT NULL,
    bucket_s INTEGER NOT NULL,
    windows INTEGER NOT NULL,
    inferences BIGINT NOT NULL,
    errors BIGINT NOT NULL,
    latency_count BIGINT NOT NULL,   -- inferences of the windows with latency figures
    p50_sum DOUBLE PRECISION NOT NULL,  -- sum of p50_ms * inferences
    p99_sum DOUBLE PRECISION NOT NULL,
    p99_max_ms DOUBLE PRECISION,
    memory_mb_max DOUBLE PRECISION,
    window_start_min TIMESTAMPTZ NOT NULL,
    window_end_max TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (fleet, device, model, bundle_id, bucket_s, bucket_start)
);
CREATE INDEX IF NOT EXISTS telemetry_model_rollups_by_start ON telemetry_model_rollups (bucket_start);

-- Windows stored before this version: their own model rows (model '', the agents named none), so that the
-- per-model figures cover the same windows as the device-wide ones.
INSERT INTO telemetry_model_windows (fleet, device, seq, model, bundle_id, window_start, window_end, inferences, errors,
    p50_ms, p99_ms, throughput_per_s, memory_mb)
SELECT fleet, device, seq, '', bundle_id, window_start, window_end, inferences, errors, p50_ms, p99_ms, throughput_per_s,
    NULL
FROM telemetry_windows w
WHERE NOT EXISTS (SELECT 1 FROM telemetry_model_windows m WHERE m.fleet = w.fleet AND m.device = w.device AND m.seq = w.seq)
ON CONFLICT DO NOTHING;
INSERT INTO telemetry_model_rollups (fleet, device, model, bundle_id, bucket_start, bucket_s, windows, inferences, errors,
    latency_count, p50_sum, p99_sum, p99_max_ms, memory_mb_max, window_start_min, window_end_max)
SELECT fleet, device, '', bundle_id, bucket_start, bucket_s, windows, inferences, errors, latency_count, p50_sum, p99_sum,
    p99_max_ms, NULL, window_start_min, window_end_max
FROM telemetry_rollups r
WHERE NOT EXISTS (SELECT 1 FROM telemetry_model_rollups m WHERE m.fleet = r.fleet AND m.device = r.device
                  AND m.bucket_s = r.bucket_s AND m.bucket_start = r.bucket_start)
ON CONFLICT DO NOTHING;
