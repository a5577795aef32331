-- edgekit fleet store, PostgreSQL, version 5: what each device says it is (issue 19). Agents since status.v1's
-- optional identity / power_mode fields report board, SoC, OS, L4T, JetPack, CUDA, TensorRT, ONNX Runtime and
-- the nvpmodel power mode; the detected target goes to device_targets as before. One row per device, from its
-- newest status that carried them; power_mode is the label reports group by ("MAXN_SUPER", "15W+clocks").

CREATE TABLE IF NOT EXISTS device_identity (
    fleet TEXT NOT NULL,
    device TEXT NOT NULL,
    board TEXT,
    soc TEXT,
    os TEXT,
    l4t TEXT,
    jetpack TEXT,
    cuda TEXT,
    tensorrt TEXT,
    onnxruntime TEXT,
    power_mode TEXT,                  -- nvpmodel mode name, "+clocks" when jetson_clocks pinned them; NULL without nvpmodel
    clocks_locked BOOLEAN,            -- NULL when no clock domain was found
    identity JSONB NOT NULL,          -- {"identity": ..., "power_mode": ...} as the status carried them
    updated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (fleet, device)
);
