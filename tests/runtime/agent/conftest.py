"""Fixtures for the agent's tests: real Mosquitto brokers (see mosquitto.py); the tiny bundle served behind an
:class:`InferenceServer` (``server``) is in tests/runtime/conftest.py, shared with tests/runtime/agent_service."""

from __future__ import annotations

from tests.runtime.agent.mosquitto import mosquitto, mosquitto_factory  # noqa: F401 (pytest fixtures)
