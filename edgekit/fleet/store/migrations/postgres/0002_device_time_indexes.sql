-- edgekit fleet store, PostgreSQL, version 2: per-device time indexes, so that the dashboard's and
-- the report's per-device queries (fleet = ? AND device = ? AND time range) read one device's rows
-- instead of scanning every window. The primary keys lead with (fleet, device) but not with time.

CREATE INDEX telemetry_windows_by_device_end ON telemetry_windows (fleet, device, window_end);
CREATE INDEX telemetry_rollups_by_device_start ON telemetry_rollups (fleet, device, bucket_start);
