"""``/api/device`` (issue 32 item 4): a device's identity as its agent reported it, its own events, the rollouts
that included it with its outcome in each, and 404 for a device the store does not know."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgekit.fleet.dashboard import DashboardServer
from tests.fleet.dashboard.operator_store import CAMERAS, FLEET, seed_operator_store


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = seed_operator_store(str(Path(tmp_path_factory.mktemp("device-page")) / "fleet.db"))
    with DashboardServer(url, port=0, cache_s=0.0) as server:
        yield server.url.rstrip("/")


def _get(url: str) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def test_device_page_has_identity_its_own_events_and_its_rollouts(dashboard: str) -> None:
    data = _get(f"{dashboard}/api/device?fleet={FLEET}&device={CAMERAS[0]}")
    fields = {f["name"]: f["value"] for f in data["identity"]["fields"]}
    assert fields["board"] == "NVIDIA Jetson Orin Nano 8GB Developer Kit" and fields["jetpack"] == "6.1"
    assert fields["os"] == "Ubuntu 22.04.4 LTS" and fields["power_mode"] == "15W" and data["identity"]["clocks_locked"] is False
    assert {e["device"] for e in data["events"]} == {CAMERAS[0]} and len(data["events"]) == 4
    assert [e["kind"] for e in data["events"]][:2] == ["bundle_installed", "thermal_throttle"]  # newest first
    assert [r["rollout_id"] for r in data["rollouts"]] == ["r6", "r5", "r4", "r3", "r2", "r1"]
    assert data["rollouts"][0]["state"] == "watching" and data["rollouts"][0]["outcome"] == "succeeded"
    oldest = data["rollouts"][-1]  # 14 min ago: the seeded 20 minutes of windows lie on both sides
    assert oldest["before"]["windows"] > 0 and oldest["after"]["windows"] > 0
    assert oldest["before"]["p99_ms"] == pytest.approx(oldest["after"]["p99_ms"]) and oldest["after"]["power_mean_mw"] == pytest.approx(5000.0)

    other = _get(f"{dashboard}/api/device?fleet={FLEET}&device={CAMERAS[1]}")
    assert other["identity"] is None and [e["message"] for e in other["events"]] == ["another camera's event"]


def test_unknown_device_is_404_naming_it(dashboard: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as failed:
        _get(f"{dashboard}/api/device?fleet={FLEET}&device=cam-nowhere")
    assert failed.value.code == 404
    assert "cam-nowhere" in json.loads(failed.value.read())["error"]
    with pytest.raises(urllib.error.HTTPError) as missing:
        _get(f"{dashboard}/api/device?fleet={FLEET}")
    assert missing.value.code == 400
