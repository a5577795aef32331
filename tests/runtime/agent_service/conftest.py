"""Fixtures for the agent tests: a fleet key pair, signed bundles, and agent configs in tmp_path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from edgekit.bundle.signing import generate_keypair, sign_bundle
from tests.runtime.agent_service.bundles import make_bundle


@pytest.fixture(scope="session")
def fleet_keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("keys")
    private, public = directory / "fleet.key.pem", directory / "fleet.pub.pem"
    generate_keypair(private, public)
    return private, public


@pytest.fixture
def signed_bundle(tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Callable[..., Path]:
    """``signed_bundle(name="tiny-b", **make_bundle_options)`` -> a signed bundle directory."""

    def make(name: str = "tiny-a", *, sign: bool = True, **options: Any) -> Path:
        root = make_bundle(tmp_path / "src" / name, name=name, **options)
        if sign:
            sign_bundle(root, fleet_keys[0])
        return root

    return make


@pytest.fixture
def agent_config(tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Callable[..., Path]:
    """``agent_config(**overrides)`` -> path of a valid agent YAML (sections replaced by overrides)."""

    def write(**overrides: Any) -> Path:
        data: dict[str, Any] = {
            "device_id": "dev-1",
            "fleet": "lab",
            "bundles": {"dir": str(tmp_path / "bundles"), "public_key": str(fleet_keys[1]), "allowed_sources": [str(tmp_path)]},
            "api": {"address": "127.0.0.1:0"},
            "telemetry": {"interval_s": 60, "spool": {"path": str(tmp_path / "spool.db")}},
            "power": {"sensor": "none"},
            "health": {"window_s": 0, "max_error_rate": 0.1, "min_requests": 1},
        }
        data.update(overrides)
        path = tmp_path / "agent.yaml"
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        return path

    return write
