"""Which spooled windows leave, and which are published again (issue 28 item 2): DeliveryTracker on a real
Spool, and MqttLink with ``collector_ack`` on a real Mosquitto whose collector never acknowledges."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edgekit_runtime.agent.backoff import Backoff
from edgekit_runtime.agent.config import parse_config
from edgekit_runtime.agent.delivery import DeliveryTracker
from edgekit_runtime.agent.errors import AgentConfigError
from edgekit_runtime.agent.mqtt import MqttLink
from edgekit_runtime.agent.spool import Spool
from edgekit_runtime.agent.telemetry import encode_message
from edgekit_runtime.agent.topics import DeviceTopics, TelemetryError
from tests.runtime.agent.mosquitto import MessageRecorder, MosquittoBroker
from tests.runtime.agent.sample_messages import sample_telemetry

TOPICS = DeviceTopics("lab", "dev-1")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _ack(*ranges: tuple[int, int], device: str = "dev-1", fleet: str = "lab") -> bytes:
    return json.dumps({"schema": "edgekit.ack/1", "fleet": fleet, "device": device, "stored": [list(r) for r in ranges],
                       "at": "2026-01-02T03:04:05.000000Z"}).encode()  # fmt: skip


def _spooled(spool: Spool, count: int) -> list[int]:
    return [spool.append(TOPICS.telemetry, encode_message(sample_telemetry(spool.next_seq()))) for _ in range(count)]


def _send_all(tracker: DeliveryTracker, spool: Spool) -> None:
    entries = spool.peek(1000)
    for entry in entries:
        tracker.sent(entry)
    tracker.settle([(entry.id, entry.topic) for entry in entries], [])  # every PUBACK in


def _seqs(entries: list) -> list[int]:  # type: ignore[type-arg]
    return [json.loads(entry.payload)["seq"] for entry in entries]


def test_windows_stay_after_the_puback_and_leave_on_the_collectors_ack(tmp_path: Path) -> None:
    clock = Clock()
    with Spool(tmp_path / "spool.db") as spool:
        tracker = DeliveryTracker(TOPICS, spool, "collector_ack", resend_after_s=30, hole_grace_s=5, clock=clock)
        _spooled(spool, 5)
        event = spool.append(TOPICS.events, b'{"kind": "pong"}')
        _send_all(tracker, spool)
        assert spool.backlog() == 5  # the event left on its PUBACK, the windows wait for the collector
        assert event not in [entry.id for entry in spool.peek(10)]
        assert tracker.ack_received(_ack((3, 5))) == 3
        assert _seqs(spool.peek(10)) == [1, 2]
        clock.now += 1
        assert tracker.take_due(16) == []
        clock.now += 5  # seqs 1-2 are older than the confirmed 3-5: sent again after the 5 s grace
        again = tracker.take_due(16)
        assert _seqs(again) == [1, 2]
        for entry in again:
            tracker.sent(entry, resend=True)
        clock.now += 6
        assert tracker.take_due(16) == []  # the grace doubles with each send
        clock.now += 5
        assert _seqs(tracker.take_due(16)) == [1, 2]
        assert tracker.ack_received(_ack((1, 2))) == 2
        assert spool.backlog() == 0
        counters = tracker.counters()
        assert (counters.awaiting, counters.confirmed, counters.resent, counters.acks_received) == (0, 5, 2, 2)


def test_without_any_ack_only_the_newest_window_is_sent_again_as_a_probe(tmp_path: Path) -> None:
    """A silent collector costs one probe per resend interval, not the whole spool again; once the probe is
    confirmed the older windows are a hole and follow at once (their grace is long over)."""
    clock = Clock()
    with Spool(tmp_path / "spool.db") as spool:
        tracker = DeliveryTracker(TOPICS, spool, "collector_ack", resend_after_s=30, resend_max_s=60, hole_grace_s=5,
                                  clock=clock)  # fmt: skip
        _spooled(spool, 3)
        _send_all(tracker, spool)
        clock.now += 29
        assert tracker.take_due(16) == []
        clock.now += 1
        (probe,) = tracker.take_due(16)
        assert _seqs([probe]) == [3]
        tracker.sent(probe, resend=True)
        clock.now += 59
        assert tracker.take_due(16) == []
        clock.now += 1  # 30 s doubled to 60 s (resend_max_s)
        (probe,) = tracker.take_due(16)
        tracker.sent(probe, resend=True)
        tracker.ack_received(_ack((3, 3)))  # the collector is back
        assert _seqs(tracker.take_due(16)) == [1, 2]
        assert tracker.counters().resent == 2


def test_an_ack_before_the_send_and_windows_dropped_by_the_bound(tmp_path: Path) -> None:
    clock = Clock()
    with Spool(tmp_path / "spool.db", max_messages=3) as spool:
        tracker = DeliveryTracker(TOPICS, spool, "collector_ack", resend_after_s=30, hole_grace_s=5, clock=clock)
        _spooled(spool, 3)
        _send_all(tracker, spool)
        _spooled(spool, 2)  # over the bound: seqs 1 and 2 are dropped while they await the collector
        assert spool.dropped_total() == 2
        clock.now += 30
        (probe,) = tracker.take_due(16)
        assert _seqs([probe]) == [3]
        tracker.sent(probe, resend=True)
        # the collector confirms seq 4 before this process sent it (an earlier process did, before a restart)
        tracker.ack_received(_ack((4, 4)))
        entry_4, entry_5 = spool.peek(10, after_id=probe.id)
        assert tracker.already_confirmed(entry_4) and not tracker.already_confirmed(entry_5)
        clock.now += 5  # 1 and 2 are now a hole, but gone from the spool: forgotten, not sent
        assert tracker.take_due(16) == []
        assert tracker.counters().awaiting == 1


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (b"{not json", "ack payload"),
        (_ack((1, 2), device="dev-2"), "names 'lab'/'dev-2', not this device"),
        (_ack((5, 2)), "first seq is past its last"),
        (json.dumps({"schema": "edgekit.ack/1", "fleet": "lab", "device": "dev-1", "stored": [[1]],
                     "at": "2026-01-02T03:04:05Z"}).encode(), "ack.v1"),  # fmt: skip
        (b"[" * 100 + b"]" * 100, "ack payload"),
    ],
)
def test_a_bad_ack_removes_nothing_and_is_counted(tmp_path: Path, payload: bytes, problem: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    with Spool(tmp_path / "spool.db") as spool:
        tracker = DeliveryTracker(TOPICS, spool, "collector_ack")
        _spooled(spool, 3)
        _send_all(tracker, spool)
        assert tracker.ack_received(payload) == 0
        assert spool.backlog() == 3 and tracker.counters().acks_refused == 1
    assert problem in caplog.text and "edgekit/v1/lab/dev-1/ack" in caplog.text


def test_broker_ack_mode_removes_on_the_puback(tmp_path: Path) -> None:
    with Spool(tmp_path / "spool.db") as spool:
        tracker = DeliveryTracker(TOPICS, spool, "broker_ack")
        _spooled(spool, 3)
        _send_all(tracker, spool)
        assert spool.backlog() == 0 and tracker.take_due(16) == []
        with pytest.raises(TelemetryError, match="delivery must be one of collector_ack, broker_ack, got 'both'"):
            DeliveryTracker(TOPICS, spool, "both")  # type: ignore[arg-type]


def test_config_delivery_defaults_to_collector_ack_and_names_a_bad_value(tmp_path: Path) -> None:
    base = {"device_id": "dev-1", "fleet": "lab", "bundles": {"dir": str(tmp_path / "b"), "allow_unsigned": True},
            "telemetry": {"spool": {"path": str(tmp_path / "spool.db")}}}  # fmt: skip
    config = parse_config(base, file=tmp_path / "agent.yaml")
    assert (config.telemetry.delivery, config.telemetry.resend_after_s) == ("collector_ack", 30.0)
    base["telemetry"]["delivery"] = "broker_ack"  # type: ignore[index]
    assert parse_config(base, file=tmp_path / "agent.yaml").telemetry.delivery == "broker_ack"
    base["telemetry"]["delivery"] = "collector"  # type: ignore[index]
    with pytest.raises(AgentConfigError, match="telemetry.delivery.*must be collector_ack or broker_ack, got 'collector'"):
        parse_config(base, file=tmp_path / "agent.yaml")


def _wait(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.05)
    return predicate()


def test_a_collector_that_never_acks_neither_stalls_the_link_nor_grows_the_spool(
    mosquitto: MosquittoBroker, tmp_path: Path
) -> None:
    """An older collector (no ack.v1): every window still reaches the broker at once, and the spool stays at its
    bound, dropping the oldest (counted)."""
    with MessageRecorder(mosquitto, ("edgekit/v1/lab/+/telemetry",)) as recorder, \
            Spool(tmp_path / "spool.db", max_messages=20) as spool:  # fmt: skip
        with MqttLink(mosquitto.url, "dev-1", "lab", "dev-1", spool=spool, backoff=Backoff(0.1, 0.3), keepalive_s=5,
                      delivery="collector_ack", resend_after_s=60) as link:  # fmt: skip
            link.wait_connected(10)
            for _ in range(50):
                link.publish_telemetry(sample_telemetry(spool.next_seq(), spool=spool))
                time.sleep(0.01)
            assert _wait(lambda: len({m.json()["seq"] for m in recorder.on("/telemetry")}) == 50, 10)  # type: ignore[index]
            assert spool.backlog() == 20 and spool.dropped_total() == 30
            # the broker's PUBACKs arrive on the link's network thread: the recorder can see the 50th window before the
            # link has counted its PUBACK (seen as 49 of 50 under load), so wait for the count rather than read it once
            assert _wait(lambda: link.counters.acked == 50, 10), link.counters
            assert link.delivery.counters().awaiting <= 20
