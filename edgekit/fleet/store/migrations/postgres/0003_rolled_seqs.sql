-- edgekit fleet store, PostgreSQL, version 3: the sequence numbers of rolled-up windows, so that a
-- window redelivered after its raw row was rolled up (QoS 1 redelivery, spool replay) is recognised and
-- not stored and counted a second time. One row per run of consecutive seqs of a device; retention
-- merges runs and closes gaps older than its horizon, so a device keeps a handful of rows.

CREATE TABLE telemetry_rolled_seqs (
    fleet TEXT NOT NULL,
    device TEXT NOT NULL,
    seq_first BIGINT NOT NULL,
    seq_last BIGINT NOT NULL,
    window_end_max TIMESTAMPTZ NOT NULL,  -- the latest window end among them: a later window is not a redelivery
    rolled_at TIMESTAMPTZ NOT NULL,  -- when the run last grew
    PRIMARY KEY (fleet, device, seq_first)
);

-- Windows rolled up before this version: each rollup's seq range (gaps inside a bucket count as seen).
INSERT INTO telemetry_rolled_seqs (fleet, device, seq_first, seq_last, window_end_max, rolled_at)
SELECT fleet, device, seq_min, MAX(seq_max), MAX(window_end_max), MAX(received_at_max)
FROM telemetry_rollups GROUP BY fleet, device, seq_min;
