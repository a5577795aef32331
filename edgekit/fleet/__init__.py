"""Fleet telemetry on the host side: collector (MQTT -> store), stores (SQLite, PostgreSQL), status and
report queries, rollout, dashboard, Prometheus metrics, a local stack and a device simulator."""
