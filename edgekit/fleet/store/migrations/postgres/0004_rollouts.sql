-- edgekit fleet store, PostgreSQL, version 4: the record of every `edgekit fleet deploy` rollout (waves, per-device
-- outcome and the device's reason, health gates, timings) as one JSON document per rollout, so that reports and
-- the dashboard read rollouts through the store (FleetStore.rollouts). Databases where an older edgekit created
-- the table on first use keep their rows.

CREATE TABLE IF NOT EXISTS edgekit_rollouts (
    rollout_id TEXT PRIMARY KEY,
    fleet TEXT NOT NULL,
    bundle_id TEXT NOT NULL,
    state TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    record JSONB NOT NULL             -- RolloutRecord.to_json()
);

CREATE INDEX IF NOT EXISTS edgekit_rollouts_fleet_started ON edgekit_rollouts (fleet, started_at);
CREATE INDEX IF NOT EXISTS edgekit_rollouts_started ON edgekit_rollouts (started_at);
