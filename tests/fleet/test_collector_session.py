"""A collector with a persistent session gets, on its next start with the same client id, what was published
while it was stopped (MQTT 3.1.1 ``clean_session=False`` and MQTT 5 session expiry, on a real Mosquitto)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from edgekit.fleet.collector import Collector
from edgekit.fleet.errors import CollectorError
from edgekit.fleet.store import open_store
from edgekit_runtime.agent.telemetry import encode_message
from tests.fleet.messages import Publisher, telemetry, topic
from tests.runtime.agent.mosquitto import MosquittoBroker


@pytest.mark.parametrize("mqtt_version", ["3.1.1", "5"])
def test_what_is_published_while_the_collector_is_stopped_waits_for_it(fleet_broker: MosquittoBroker, tmp_path: Path,
                                                                       mqtt_version: str) -> None:  # fmt: skip
    fleet = f"session{mqtt_version.replace('.', '')}"
    messages = [(topic("telemetry", fleet=fleet), encode_message(telemetry(seq, fleet=fleet))) for seq in range(1, 41)]
    options = {"client_id": f"session-test-{fleet}", "fleet": fleet, "session_expiry_s": 300,
               "mqtt_version": mqtt_version, "flush_interval_s": 0.05}  # fmt: skip
    with open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as store:
        with Publisher(fleet_broker) as device:
            with Collector(fleet_broker.url, store, **options):  # type: ignore[arg-type]
                device.publish_many(messages[:10])
                deadline = time.monotonic() + 10
                while len(list(store.windows())) < 10 and time.monotonic() < deadline:
                    time.sleep(0.05)
            device.publish_many(messages[10:])  # the collector is stopped: the broker queues for its session
            with Collector(fleet_broker.url, store, **options) as again:  # type: ignore[arg-type]
                deadline = time.monotonic() + 10
                while len(list(store.windows())) < 40 and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert again.metrics.snapshot()["received"]["telemetry"] == 30
        assert [w.seq for w in store.windows()] == list(range(1, 41))


def test_session_expiry_is_checked(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as store:
        with pytest.raises(CollectorError, match=r"session_expiry_s must be an integer from 0 to 4294967295, got -1"):
            Collector("mqtt://127.0.0.1:1883", store, client_id="x", session_expiry_s=-1)
        with pytest.raises(CollectorError, match="persistent session .* needs a client_id") as info:
            Collector("mqtt://127.0.0.1:1883", store, client_id="", session_expiry_s=60)
        assert "default_client_id" in (info.value.hint or "")


@pytest.mark.parametrize("mqtt_version", ["3.1.1", "5"])
def test_retiring_a_group_member_stores_its_share_and_ends_its_session(fleet_broker: MosquittoBroker, tmp_path: Path,
                                                                       mqtt_version: str) -> None:  # fmt: skip
    """Mosquitto routes part of a shared group's messages to a stopped member's persistent session; retire()
    stores them and ends the session, and everything after goes to the member that stays."""
    fleet = f"retire{mqtt_version.replace('.', '')}"
    messages = [(topic("telemetry", fleet=fleet), encode_message(telemetry(seq, fleet=fleet))) for seq in range(1, 101)]
    common = {"fleet": fleet, "shared_group": "g", "session_expiry_s": 300, "mqtt_version": mqtt_version,
              "flush_interval_s": 0.05}  # fmt: skip
    with open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as store, Publisher(fleet_broker) as device:
        staying = Collector(fleet_broker.url, store, client_id=f"{fleet}-a", **common).start()  # type: ignore[arg-type]
        try:
            with Collector(fleet_broker.url, store, client_id=f"{fleet}-b", **common):  # type: ignore[arg-type]
                pass  # subscribed, then stopped: its session stays, with its share of the group
            device.publish_many(messages[:60])
            time.sleep(0.5)
            assert len(list(store.windows())) < 60  # part of them wait in the stopped member's session
            leaving = Collector(fleet_broker.url, store, client_id=f"{fleet}-b", **common)  # type: ignore[arg-type]
            drained = leaving.retire(idle_s=1.0)
            assert drained is not None and drained > 0
            device.publish_many(messages[60:])
            deadline = time.monotonic() + 10
            while len(list(store.windows())) < 100 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert [w.seq for w in store.windows()] == list(range(1, 101))
            assert staying.metrics.snapshot()["received"]["telemetry"] == 100 - drained
        finally:
            staying.stop()
        again = Collector(fleet_broker.url, store, client_id=f"{fleet}-b", **common)  # type: ignore[arg-type]
        assert again.retire(idle_s=0.2) is None  # the session is gone


def test_retire_needs_a_persistent_session(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as store:
        with pytest.raises(CollectorError, match=r"retire\(\) needs session_expiry_s > 0"):
            Collector("mqtt://127.0.0.1:1883", store, client_id="x").retire()
