"""End-to-end delivery (issue 28 item 2): a broker ``kill -9`` with windows queued for a stopped collector.

Real components throughout: a private Mosquitto killed with SIGKILL and started again, the agent's real
MqttLink and Spool, the real Collector on a SQLite store. With ``delivery="collector_ack"`` the windows
the broker lost are still in the spool and are published again once the collector is back: none lost,
none stored twice. The same run with ``broker_ack`` (the behaviour before) loses them, which shows the
test reproduces the fault."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edgekit.fleet.acks import build_acks, seq_ranges
from edgekit.fleet.collector import Collector
from edgekit.fleet.store import open_store
from edgekit_runtime.agent.backoff import Backoff
from edgekit_runtime.agent.mqtt import MqttLink
from edgekit_runtime.agent.spool import Spool
from edgekit_runtime.schemas import validate_message
from tests.runtime.agent.mosquitto import MosquittoBroker, render_acl_template, write_password_file
from tests.runtime.agent.sample_messages import WINDOW_START, sample_telemetry

FLEET = "lab"
WINDOWS = 60


def _wait(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _link(broker: MosquittoBroker, spool: Spool, device: str, delivery: str, **kwargs: object) -> MqttLink:
    return MqttLink(broker.url, device, FLEET, device, spool=spool, backoff=Backoff(0.1, 0.3), keepalive_s=5,
                    delivery=delivery, resend_after_s=1.0, **kwargs)  # type: ignore[arg-type]  # fmt: skip


def _collector(broker: MosquittoBroker, store_url: str, **kwargs: object) -> Collector:
    return Collector(broker.url, open_store(store_url), client_id="collector-acks", fleet=FLEET,
                     session_expiry_s=3600, **kwargs).start()  # type: ignore[arg-type]  # fmt: skip


def _stored(store_url: str, device: str) -> list[int]:
    with open_store(store_url) as store:
        return [w.seq for w in store.windows(fleet=FLEET, device=device)]


@pytest.mark.parametrize("persistence", [True, False], ids=["persistence", "mosquitto-defaults"])
def test_broker_kill_with_queued_windows_loses_nothing(tmp_path: Path, persistence: bool) -> None:
    extra = ("max_queued_messages 0",) if persistence else ()
    broker = MosquittoBroker(tmp_path / "mosquitto", persistence=persistence, extra_config=extra).start()
    store_url = f"sqlite:///{tmp_path / 'fleet.db'}"
    try:
        first = _collector(broker, store_url)
        first.stop()  # its session stays: the broker queues for it
        first.store.close()
        with Spool(tmp_path / "spool.db") as spool:
            link = _link(broker, spool, "dev-1", "collector_ack").start()
            link.wait_connected(10)
            for _ in range(WINDOWS):
                link.publish_telemetry(sample_telemetry(spool.next_seq(), device="dev-1", fleet=FLEET))
            assert _wait(lambda: link.counters.acked == WINDOWS, 15), link.counters
            assert spool.backlog() == WINDOWS  # the broker has them all; the spool keeps them for the collector
            assert link.delivery.counters().awaiting == WINDOWS

            broker.kill()  # kill -9: the queue for the collector is gone (no autosave since)
            broker.start()
            # The agent reconnects before the collector is back; the collector's session died with the broker.
            assert _wait(lambda: link.counters.reconnects >= 1 and link.connected, 15), link.counters
            time.sleep(0.5)
            second = _collector(broker, store_url)
            try:
                assert _wait(lambda: spool.backlog() == 0, 30), (spool.backlog(), link.delivery.counters())
                assert second.flush(10)
                counters = link.delivery.counters()
                health = link.link_state.to_dict()["delivery"]  # what /v1/health shows as broker.delivery
            finally:
                link.stop()
                second.stop()
                second.store.close()
        seqs = _stored(store_url, "dev-1")
        assert sorted(set(seqs)) == list(range(1, WINDOWS + 1)), f"lost: {sorted(set(range(1, WINDOWS + 1)) - set(seqs))}"
        assert len(seqs) == len(set(seqs))  # none stored twice
        assert counters.confirmed == WINDOWS and counters.awaiting == 0
        assert counters.resent >= WINDOWS  # the probe after resend_after_s, then the rest as a hole
        assert health["mode"] == "collector_ack" and health["confirmed"] == WINDOWS and health["last_ack_at"].endswith("Z")
    finally:
        broker.stop()


def test_broker_ack_mode_loses_the_queued_windows(tmp_path: Path) -> None:
    """The fault as reported: with the old behaviour the spool is empty after the PUBACKs and the kill loses all."""
    broker = MosquittoBroker(tmp_path / "mosquitto", persistence=True, extra_config=("max_queued_messages 0",)).start()
    store_url = f"sqlite:///{tmp_path / 'fleet.db'}"
    try:
        first = _collector(broker, store_url)
        first.stop()
        first.store.close()
        with Spool(tmp_path / "spool.db") as spool:
            with _link(broker, spool, "dev-1", "broker_ack") as link:
                link.wait_connected(10)
                for _ in range(20):
                    link.publish_telemetry(sample_telemetry(spool.next_seq(), device="dev-1", fleet=FLEET))
                assert link.flush(15)
                broker.kill()
                broker.start()
                second = _collector(broker, store_url)
                time.sleep(1.5)
                second.stop()
                second.store.close()
        assert _stored(store_url, "dev-1") == []
    finally:
        broker.stop()


def test_a_new_spool_whose_seqs_start_again_is_stored_not_acked_as_a_redelivery(tmp_path: Path) -> None:
    """A damaged spool moved away (as its error says) or a reflashed device: the new spool numbers its windows
    from 1 again while the collector still holds the old ones raw. Its windows are later, so they are stored and
    then confirmed; before, they were confirmed as already held and the spool deleted them unstored."""
    broker = MosquittoBroker(tmp_path / "mosquitto").start()
    store_url = f"sqlite:///{tmp_path / 'fleet.db'}"
    try:
        collector = _collector(broker, store_url)
        try:
            for spool_file, hours_on in (("spool.db", 0), ("spool-new.db", 1)):
                with Spool(tmp_path / spool_file) as spool:
                    with _link(broker, spool, "dev-1", "collector_ack") as link:
                        link.wait_connected(10)
                        for _ in range(10):
                            seq = spool.next_seq()
                            start = WINDOW_START + dt.timedelta(hours=hours_on, seconds=10 * seq)
                            link.publish_telemetry(sample_telemetry(seq, device="dev-1", fleet=FLEET, window_start=start,
                                                                    window_end=start + dt.timedelta(seconds=10)))  # fmt: skip
                        assert _wait(lambda: spool.backlog() == 0, 20), (spool.backlog(), link.delivery.counters())
                        assert link.delivery.counters().confirmed == 10
            assert collector.flush(10)
        finally:
            collector.stop()
            collector.store.close()
        with open_store(store_url) as store:
            raw = [(w.seq, w.window_start) for w in store.windows(fleet=FLEET, device="dev-1")]
            (totals,) = store.aggregate(("device",), devices=[(FLEET, "dev-1")])
        assert [seq for seq, _ in raw] == list(range(1, 11))
        assert all(start >= WINDOW_START + dt.timedelta(hours=1) for _, start in raw)  # the new spool's
        assert totals.windows == 20  # the old spool's ten rolled up, counted once
    finally:
        broker.stop()


def test_collector_acks_through_the_shipped_acl(tmp_path: Path) -> None:
    """With the ACL template, the collector may write a device's ack topic and only that device reads it."""
    passwords = {"dev-a": "pass-a", "dev-b": "pass-b", "collector": "pass-c"}
    password_file = write_password_file(tmp_path / "passwd", passwords)
    acl = render_acl_template(tmp_path / "acl", collector_user="collector")
    broker = MosquittoBroker(tmp_path / "mosquitto", password_file=password_file, acl_file=acl).start()
    secrets = {}
    for user, password in passwords.items():
        secrets[user] = tmp_path / f"{user}.secret"
        secrets[user].write_text(password + "\n")
        secrets[user].chmod(0o600)
    store_url = f"sqlite:///{tmp_path / 'fleet.db'}"
    try:
        collector = Collector(broker.url, open_store(store_url), client_id="collector-acl", fleet=FLEET,
                              username="collector", password_file=secrets["collector"]).start()  # fmt: skip
        with Spool(tmp_path / "a.db") as spool_a, Spool(tmp_path / "b.db") as spool_b:
            link_a = _link(broker, spool_a, "dev-a", "collector_ack", username="dev-a", password_file=secrets["dev-a"])
            link_b = _link(broker, spool_b, "dev-b", "collector_ack", username="dev-b", password_file=secrets["dev-b"])
            with link_a, link_b:
                link_a.wait_connected(10)
                link_b.wait_connected(10)
                for _ in range(5):
                    link_a.publish_telemetry(sample_telemetry(spool_a.next_seq(), device="dev-a", fleet=FLEET))
                assert _wait(lambda: spool_a.backlog() == 0, 15), link_a.delivery.counters()
                assert link_a.delivery.counters().acks_received >= 1
                assert link_b.delivery.counters().acks_received == 0  # dev-a's acks never reach dev-b
        collector.stop()
        collector.store.close()
        assert sorted(_stored(store_url, "dev-a")) == [1, 2, 3, 4, 5]
    finally:
        broker.stop()


def test_ack_messages_match_their_schema_and_split_long_range_lists() -> None:
    class Window:
        def __init__(self, device: str, seq: int) -> None:
            self.fleet, self.device, self.seq = FLEET, device, seq

    assert seq_ranges([9, 1, 2, 3, 7, 10, 2]) == [(1, 3), (7, 7), (9, 10)]
    windows = [Window("dev-1", seq) for seq in range(1, 1200, 2)] + [Window("dev-2", 5)]  # 600 one-seq ranges
    messages = build_acks(windows, collector="c", at="2026-01-02T03:04:05.000000Z")
    assert [topic for topic, _ in messages] == ["edgekit/v1/lab/dev-1/ack"] * 3 + ["edgekit/v1/lab/dev-2/ack"]
    import json

    for _, payload in messages:
        validate_message(json.loads(payload), "ack.v1")
    assert sum(len(json.loads(payload)["stored"]) for _, payload in messages[:3]) == 600
