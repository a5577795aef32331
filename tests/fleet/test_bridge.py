"""Two Mosquitto brokers bridged with deploy/mosquitto/bridge.conf: devices on the site broker (A), the
collector on the central broker (B).

What is checked, with real brokers, simulated devices (FleetSimulator) and a real Collector:

* every telemetry window published on A is stored by the collector subscribed to B (counted in the
  store: 0 lost, no gaps), with the devices' retained ``online`` status and their events;
* the collector's per-device acks (published on B) reach the devices' ``ack`` topics on A, and a
  command published on B reaches a device on A, whose answer (a pong event) comes back and is stored;
* while B is down, A keeps the bridge's QoS 1 messages and sends them once B is back: 0 lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgekit.fleet.collector import Collector
from edgekit.fleet.commands import CommandPublisher, build_command
from edgekit.fleet.simulate import FleetSimulator, SimulationConfig
from edgekit.fleet.store import FleetStore, open_store
from tests.runtime.agent.mosquitto import MessageRecorder, MosquittoBroker

REPO = Path(__file__).resolve().parents[2]
BRIDGE_TEMPLATE = REPO / "deploy" / "mosquitto" / "bridge.conf"
FLEET = "bridged"
BRIDGE_NAME = "edgekit-site-test"
DEVICES, WINDOWS = 8, 25


def bridge_config(central: MosquittoBroker, *, fleet: str = FLEET, name: str = BRIDGE_NAME) -> list[str]:
    """deploy/mosquitto/bridge.conf with its placeholders filled in for ``central``, as config lines."""
    text = BRIDGE_TEMPLATE.read_text(encoding="utf-8")
    text = (text.replace("@BRIDGE_NAME@", name).replace("@CENTRAL_ADDRESS@", f"{central.host}:{central.port}")
            .replace("@FLEET@", fleet))  # fmt: skip
    assert "@" not in "".join(line for line in text.splitlines() if not line.startswith("#")), "a placeholder is left"
    return text.splitlines()


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.05)


def wait_bridge_connected(central: MosquittoBroker, timeout_s: float = 15.0) -> None:
    """Wait for the bridge's notification (``1``, retained) on the central broker."""
    topic = f"$SYS/broker/connection/{BRIDGE_NAME}/state"
    with MessageRecorder(central, [topic]) as recorder:
        if not recorder.wait_for(lambda messages: any(m.payload == b"1" for m in messages), timeout_s):
            raise AssertionError(f"the bridge did not connect to {central.url} within {timeout_s:g} s:\n{central.log()}")


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[tuple[MosquittoBroker, MosquittoBroker]]:
    """(site A with the bridge, central B), both keeping sessions and queues across a restart."""
    central = MosquittoBroker(tmp_path / "central", persistence=True, extra_config=["max_queued_messages 0"]).start()
    site = MosquittoBroker(tmp_path / "site", persistence=True,
                           extra_config=["max_queued_messages 0", *bridge_config(central)])  # fmt: skip
    try:
        site.start()
        wait_bridge_connected(central)
        yield site, central
    finally:
        site.stop()
        central.stop()


def _stored_windows(store: FleetStore) -> int:
    return sum(s.windows for s in store.device_summaries(FLEET))


def _acked_seqs(recorder: MessageRecorder) -> dict[str, set[int]]:
    acked: dict[str, set[int]] = {}
    for message in recorder.on("/ack"):
        ack = message.json()
        assert isinstance(ack, dict) and ack["schema"] == "edgekit.ack/1", ack
        for first, last in ack["stored"]:
            acked.setdefault(ack["device"], set()).update(range(first, last + 1))
    return acked


def test_telemetry_on_a_is_stored_by_a_collector_on_b_and_acks_and_commands_come_back(
    brokers: tuple[MosquittoBroker, MosquittoBroker], tmp_path: Path
) -> None:
    site, central = brokers
    store_url = f"sqlite:///{tmp_path / 'fleet.db'}"
    with open_store(store_url) as store, MessageRecorder(site, [f"edgekit/v1/{FLEET}/+/ack"]) as acks_on_site:
        collector = Collector(central.url, store, client_id="central-collector", fleet=FLEET, session_expiry_s=600).start()
        simulator = FleetSimulator(SimulationConfig(site.url, devices=DEVICES, rate_per_s=0.01, fleet=FLEET, seed=3,
                                                    load=0.5))  # fmt: skip
        try:
            simulator.start(telemetry=False)
            sent = simulator.publish_backlog(WINDOWS)
            assert simulator.flush(30), "site broker did not acknowledge every window"
            wait_until(lambda: collector.metrics.snapshot()["stored"].get("telemetry", 0) >= sent, 30,
                       f"{sent} windows stored through the bridge")  # fmt: skip
            collector.flush()

            # counted in the store: every window, none missing, none twice
            summaries = {s.device: s for s in store.device_summaries(FLEET)}
            assert sorted(summaries) == sorted(simulator.agents)
            assert _stored_windows(store) == sent == DEVICES * WINDOWS
            for device, summary in summaries.items():
                assert summary.windows == WINDOWS and summary.missing_seqs == 0, summary
                assert store.missing_seqs(FLEET, device) == []
                assert summary.state == "online", summary  # the retained status came over the bridge
            serving = [e for e in store.events(FLEET, limit=1000) if e.kind == "serving"]
            assert sorted(e.device for e in serving) == sorted(simulator.agents)  # their start-up events

            # the collector's acks (published on B) reach every device's ack topic on A, naming every seq
            expected = {device: set(range(1, WINDOWS + 1)) for device in simulator.agents}
            assert acks_on_site.wait_for(lambda _: _acked_seqs(acks_on_site) == expected, 15), _acked_seqs(acks_on_site)

            # a command published on B reaches a device on A; its pong comes back over the bridge and is stored
            device = sorted(simulator.agents)[0]
            ping = build_command("ping")
            with CommandPublisher(central.url).connect() as commands:
                commands.send(FLEET, device, ping)

            def pong_stored() -> bool:
                collector.flush()
                return any(e.kind == "pong" and e.command_id == ping["id"] for e in store.events(FLEET, device=device))

            wait_until(pong_stored, 15, f"the pong of {device} stored on the central side")
        finally:
            simulator.stop()
            collector.stop()


def test_nothing_is_lost_while_the_central_broker_is_down(
    brokers: tuple[MosquittoBroker, MosquittoBroker], tmp_path: Path
) -> None:
    site, central = brokers
    store_url = f"sqlite:///{tmp_path / 'fleet.db'}"
    with open_store(store_url) as store:
        collector = Collector(central.url, store, client_id="central-collector", fleet=FLEET, session_expiry_s=600).start()
        simulator = FleetSimulator(SimulationConfig(site.url, devices=DEVICES, rate_per_s=0.01, fleet=FLEET, seed=4,
                                                    load=0.5))  # fmt: skip
        try:
            simulator.start(telemetry=False)
            first = simulator.publish_backlog(WINDOWS)
            assert simulator.flush(30)
            wait_until(lambda: collector.metrics.snapshot()["stored"].get("telemetry", 0) >= first, 30,
                       "the first windows stored")  # fmt: skip
            central.stop()  # SIGTERM: B saves its sessions (the collector's and the bridge's)
            second = simulator.publish_backlog(WINDOWS)  # the devices carry on: A holds these for the bridge
            assert simulator.flush(30), "the site broker must accept the devices' windows while B is down"
            time.sleep(0.5)
            central.start()
            wait_until(lambda: collector.metrics.snapshot()["stored"].get("telemetry", 0) >= first + second, 60,
                       f"{first + second} windows stored after the central broker came back")  # fmt: skip
            collector.flush()
            assert _stored_windows(store) == first + second == 2 * DEVICES * WINDOWS
            for device in simulator.agents:
                assert store.missing_seqs(FLEET, device) == []
        finally:
            simulator.stop()
            collector.stop()


def test_bridge_template_names_every_device_topic_kind_once_with_qos_1() -> None:
    """The template's topic lines against the protocol's topic kinds: a new kind needs a bridge line."""
    from edgekit_runtime.agent.topics import QOS_BY_KIND, TOPIC_KINDS

    lines = [line.split() for line in BRIDGE_TEMPLATE.read_text(encoding="utf-8").splitlines() if line.startswith("topic ")]
    directions = {fields[1].rsplit("/", 1)[-1]: (fields[2], int(fields[3])) for fields in lines}
    assert len(lines) == len(TOPIC_KINDS) and sorted(directions) == sorted(TOPIC_KINDS), lines
    assert {kind for kind, (way, _) in directions.items() if way == "out"} == {"telemetry", "status", "events"}
    assert {kind for kind, (way, _) in directions.items() if way == "in"} == {"cmd", "ack"}
    assert all(qos == QOS_BY_KIND[kind] for kind, (_, qos) in directions.items())
