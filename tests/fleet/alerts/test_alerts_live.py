"""Alerts end to end with a real Mosquitto: a collector running the alert engine while simulated devices (the
fleet simulator, and a test publisher speaking the agent's protocol) cross a p99 threshold and crash. Each alert
is seen where an operator would see it: an MQTT subscriber on ``edgekit/v1/<fleet>/alerts``, a local HTTP
server as the webhook, and the store's events; it clears when the condition ends, and one bad window does not
fire a rule with ``for:``."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from edgekit.fleet.alerts import AlertEngine, AlertRules, active_alerts
from edgekit.fleet.collector import Collector
from edgekit.fleet.simulate import FleetSimulator, SimulationConfig
from edgekit.fleet.store import open_store
from edgekit_runtime.agent.telemetry import encode_message
from tests.fleet.alerts.live_messages import AlertListener, alert_validator, live_telemetry
from tests.fleet.messages import Publisher, status, topic
from tests.runtime.agent.mosquitto import MosquittoBroker

REPO = Path(__file__).resolve().parents[3]


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


@pytest.fixture
def listener_factory(fleet_broker: MosquittoBroker) -> Iterator[Callable[[str], AlertListener]]:
    made: list[AlertListener] = []

    def make(fleet: str) -> AlertListener:
        made.append(AlertListener(fleet_broker, fleet))
        return made[-1]

    yield make
    for listener in made:
        listener.close()


def test_a_crashed_simulated_device_fires_offline_and_clears_when_it_returns(
        fleet_broker: MosquittoBroker, tmp_path: Path, listener_factory: Callable[[str], AlertListener]) -> None:  # fmt: skip
    listener = listener_factory("simalerts")
    rules = AlertRules.model_validate({"rules": {
        "device-offline": {"kind": "device_state", "states": ["offline"], "for": "1s", "severity": "critical"},
        "device-stale": {"kind": "device_state", "states": ["stale"], "for": "1s"},
    }})  # fmt: skip
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    with open_store(url) as store, open_store(url) as engine_store:
        engine = AlertEngine(rules, engine_store, fleet="simalerts", webhook_url=listener.webhook_url, evaluate_every_s=0.2)
        collector = Collector(fleet_broker.url, store, client_id="alerts-sim-collector", fleet="simalerts",
                              flush_interval_s=0.05, alerts=engine).start()  # fmt: skip
        simulator = FleetSimulator(SimulationConfig(fleet_broker.url, devices=3, rate_per_s=1.0, fleet="simalerts", load=0.5))
        try:
            simulator.start()
            devices = sorted(simulator.agents)
            wait_for(lambda: len([d for d in store.device_summaries("simalerts") if d.state == "online" and d.windows]) == 3,
                     15, "three simulated devices online with telemetry")  # fmt: skip
            victim = devices[0]
            crashed_at = time.monotonic()
            simulator.crash(victim)  # no DISCONNECT: the broker publishes its offline will

            [fired] = wait_for(lambda: listener.messages("firing", victim), 15, f"an offline alert for {victim} over MQTT")
            validator = alert_validator()
            validator.validate(fired)
            assert (fired["rule"], fired["severity"], fired["value"], fired["fleet"]) == ("device-offline", "critical", "offline", "simalerts")
            fired_after_s = next(t for t, m in listener.mqtt if m is fired) - crashed_at
            assert fired_after_s >= 1.0  # its for: 1s
            [hooked] = wait_for(lambda: listener.messages("firing", victim, "webhook"), 10, "the webhook's firing notice")
            assert hooked == fired
            [event] = [e for e in store.events("simalerts", device=victim) if e.kind == "alert_firing"]
            assert event.payload["rule"] == "device-offline" and event.level == "error"
            assert [(a.rule, a.device) for a in active_alerts(store, "simalerts")] == [("device-offline", victim)]
            time.sleep(1.5)  # the others keep reporting: nothing fires for them
            assert {m["device"] for m in listener.messages("firing")} == {victim}

            # the device comes back (its agent restarted): online status, then a window after its last seq
            last_seq = max(w.seq for w in store.windows("simalerts", victim))
            with Publisher(fleet_broker) as agent:
                agent.publish(topic("status", victim, "simalerts"), status("online", device=victim, fleet="simalerts"), retain=True)
                agent.publish(topic("telemetry", victim, "simalerts"),
                              encode_message(live_telemetry(last_seq + 1, device=victim, fleet="simalerts")))  # fmt: skip
                [resolved] = wait_for(lambda: listener.messages("resolved", victim), 10, f"{victim}'s offline alert to clear")
            validator.validate(resolved)
            assert resolved["rule"] == "device-offline" and resolved["resolved_at"] is not None
            wait_for(lambda: listener.messages("resolved", victim, "webhook"), 10, "the webhook's resolved notice")
            assert active_alerts(store, "simalerts") == []
            kinds = sorted(e.kind for e in store.events("simalerts", device=victim) if e.kind.startswith("alert_"))
            assert kinds == ["alert_firing", "alert_resolved"]
            assert engine.webhook is not None and engine.webhook.failed == 0
        finally:
            simulator.stop()
            collector.stop()


def _collect(broker: MosquittoBroker, store_url: str, rules_file: Path, webhook_url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "edgekit.cli.main", "fleet", "collect", "--broker", broker.url, "--store", store_url,
         "--fleet", "p99alerts", "--no-metrics", "--session-expiry", "0", "--duration", "60", "--alert-rules",
         str(rules_file), "--alert-webhook", webhook_url],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_fleet_collect_fires_a_p99_alert_once_it_lasts_and_clears_it(
        fleet_broker: MosquittoBroker, tmp_path: Path, listener_factory: Callable[[str], AlertListener]) -> None:  # fmt: skip
    listener = listener_factory("p99alerts")
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text("schema_version: 1\nevaluate_every: 200ms\nrules:\n  p99-slow:\n    kind: p99_above\n"
                          "    threshold_ms: 50\n    for: 2s\n    severity: warning\n    labels: {team: vision}\n")  # fmt: skip
    store_url = f"sqlite:///{tmp_path / 'fleet.db'}"
    process = _collect(fleet_broker, store_url, rules_file, listener.webhook_url)
    seq = 0

    def publish(device: Publisher, p99_ms: float, seconds: float) -> None:
        nonlocal seq
        until = time.monotonic() + seconds
        while True:
            seq += 1
            device.publish(topic("telemetry", "cam-1", "p99alerts"),
                           encode_message(live_telemetry(seq, device="cam-1", fleet="p99alerts", p99_ms=p99_ms)))  # fmt: skip
            if time.monotonic() >= until:
                return
            time.sleep(0.25)

    try:
        assert process.stderr is not None
        assert "collecting from" in process.stderr.readline()
        with Publisher(fleet_broker) as device:
            device.publish(topic("status", "cam-1", "p99alerts"), status("online", device="cam-1", fleet="p99alerts"), retain=True)
            publish(device, 10.0, 1.0)
            publish(device, 250.0, 0.0)  # one bad window ...
            publish(device, 10.0, 3.5)  # ... then good ones for longer than for: 2s
            assert listener.mqtt == [] and listener.webhook == []

            bad_since = time.monotonic()
            publish(device, 250.0, 2.5)
            [fired] = wait_for(lambda: listener.messages("firing"), 10, "the p99 alert over MQTT")
            assert next(t for t, m in listener.mqtt if m is fired) - bad_since >= 2.0
            alert_validator().validate(fired)
            assert (fired["rule"], fired["device"], fired["value"], fired["threshold"], fired["labels"]) == (
                "p99-slow", "cam-1", 250.0, 50.0, {"team": "vision"})
            publish(device, 250.0, 0.5)  # still slow: said once
            publish(device, 10.0, 0.5)
            [resolved] = wait_for(lambda: listener.messages("resolved"), 10, "the p99 alert to clear")
            assert resolved["device"] == "cam-1"
            wait_for(lambda: len(listener.webhook) == 2, 10, "both notices at the webhook")
            assert [m["status"] for _, m in listener.webhook] == ["firing", "resolved"]
            assert len(listener.messages("firing")) == 1
    finally:
        process.terminate()
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "alert p99-slow firing: cam-1 p99 250.0 ms > 50 ms" in err
    with open_store(store_url) as store:
        events = [(e.kind, e.payload["rule"], e.payload["value"], e.payload["threshold"])
                  for e in reversed(store.events("p99alerts", device="cam-1")) if e.kind.startswith("alert_")]  # fmt: skip
    assert events == [("alert_firing", "p99-slow", 250.0, 50.0), ("alert_resolved", "p99-slow", 250.0, 50.0)]


def test_a_silent_device_fires_stale_and_clears_when_heard_again(
        fleet_broker: MosquittoBroker, tmp_path: Path, listener_factory: Callable[[str], AlertListener]) -> None:  # fmt: skip
    """No last will this time (a cut network keeps the broker's session open): silence alone makes the device stale
    after 3 of its 1 s intervals; the stale alert (for: 1s) fires, and clears once the device is heard again."""
    listener = listener_factory("quietalerts")
    rules = AlertRules.model_validate({"rules": {"device-stale": {"kind": "device_state", "states": ["stale"], "for": "1s"}}})
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    with open_store(url) as store, open_store(url) as engine_store:
        engine = AlertEngine(rules, engine_store, fleet="quietalerts", evaluate_every_s=0.2)
        collector = Collector(fleet_broker.url, store, client_id="alerts-quiet-collector", fleet="quietalerts",
                              flush_interval_s=0.05, alerts=engine).start()  # fmt: skip
        try:
            with Publisher(fleet_broker) as agent:
                agent.publish(topic("status", "gw-1", "quietalerts"), status("online", device="gw-1", fleet="quietalerts"), retain=True)
                for seq in (1, 2):
                    agent.publish(topic("telemetry", "gw-1", "quietalerts"),
                                  encode_message(live_telemetry(seq, device="gw-1", fleet="quietalerts")))  # fmt: skip
                    time.sleep(0.5)
                silent_since = time.monotonic()
                [fired] = wait_for(lambda: listener.messages("firing"), 15, "the stale alert")
                assert (fired["rule"], fired["device"], fired["value"]) == ("device-stale", "gw-1", "stale")
                assert next(t for t, m in listener.mqtt if m is fired) - silent_since >= 3.0 + 1.0 - 0.5  # 3 intervals + for
                agent.publish(topic("telemetry", "gw-1", "quietalerts"),
                              encode_message(live_telemetry(3, device="gw-1", fleet="quietalerts")))  # fmt: skip
                [resolved] = wait_for(lambda: listener.messages("resolved"), 10, "the stale alert to clear")
                assert resolved["device"] == "gw-1"
        finally:
            collector.stop()
