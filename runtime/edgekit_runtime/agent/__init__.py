"""The on-device agent: serves the current bundle on a local API, reports telemetry over MQTT and
applies signed over-the-air updates with health watching and rollback (``edgekit-agent``)."""
