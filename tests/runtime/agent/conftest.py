"""Fixtures for the agent's telemetry-path tests: real Mosquitto brokers (see mosquitto.py)."""

from __future__ import annotations

from tests.runtime.agent.mosquitto import mosquitto, mosquitto_factory  # noqa: F401 (pytest fixtures)
