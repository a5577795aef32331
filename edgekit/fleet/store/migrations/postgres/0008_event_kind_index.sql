-- edgekit fleet store, PostgreSQL, version 8: events by kind and time, so that the alerts
-- firing now (active_alerts: the newest alert_firing / alert_resolved events) are read without scanning
-- every deploy and command event stored since.

CREATE INDEX IF NOT EXISTS device_events_by_kind ON device_events (kind, at);
