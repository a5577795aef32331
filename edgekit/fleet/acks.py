"""The collector's half of end-to-end delivery: after it commits a batch, it tells each device which of
its telemetry windows the store now holds.

One ``ack.v1`` message per device and batch goes to ``edgekit/v1/<fleet>/<device>/ack`` (QoS 1, not
retained), naming the seqs as inclusive ranges. Windows the store already held (a redelivery) are named
too: the agent published them again because it had not heard of them yet. A batch the store refused
(and the collector then wrote one by one) is not acknowledged at all: its windows come again, and those
stored meanwhile are then duplicates, acknowledged with their batch. Messages rejected before the store
(unparsable, wrong schema) are not acknowledged either: the agent keeps them until its spool's bound
drops them.

An agent with ``telemetry.delivery: collector_ack`` removes the named windows from its spool; an
agent that does not listen (``broker_ack``, or older) costs the broker one message it drops. The
broker's ACL must let the collector write ``edgekit/v1/+/+/ack`` (runtime/mosquitto/acl.template).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger(__name__)

ACK_QOS = 1
#: Ranges per message (the schema's maxItems); a batch with more for one device is sent in several.
MAX_RANGES_PER_ACK = 256
ACK_SCHEMA = "edgekit.ack/1"


def seq_ranges(seqs: Iterable[int]) -> list[tuple[int, int]]:
    """``[1, 2, 3, 7, 9, 10]`` -> ``[(1, 3), (7, 7), (9, 10)]`` (sorted, duplicates merged)."""
    ranges: list[tuple[int, int]] = []
    for seq in sorted(set(seqs)):
        if ranges and seq == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], seq)
        else:
            ranges.append((seq, seq))
    return ranges


def build_acks(windows: Iterable[Any], *, collector: str, at: str) -> list[tuple[str, bytes]]:
    """``(topic, payload)`` of the ``ack.v1`` messages for ``windows`` (records with fleet, device, seq)."""
    from edgekit_runtime.agent.topics import DeviceTopics

    by_device: dict[tuple[str, str], list[int]] = defaultdict(list)
    for window in windows:
        by_device[(window.fleet, window.device)].append(int(window.seq))
    messages: list[tuple[str, bytes]] = []
    for (fleet, device), seqs in by_device.items():
        topic = DeviceTopics(fleet, device).ack
        ranges = seq_ranges(seqs)
        for start in range(0, len(ranges), MAX_RANGES_PER_ACK):
            ack = {"schema": ACK_SCHEMA, "fleet": fleet, "device": device,
                   "stored": [list(r) for r in ranges[start : start + MAX_RANGES_PER_ACK]],
                   "collector": collector[:256] or "collector", "at": at}  # fmt: skip
            messages.append((topic, json.dumps(ack, separators=(",", ":")).encode()))
    return messages


class StoredAcks:
    """Publishes the acks of committed batches through the collector's paho client; counts what it sent."""

    def __init__(self, collector: str) -> None:
        self.collector = collector
        self.published = 0
        self.failed = 0
        self._lock = threading.Lock()

    def publish(self, client: Any, windows: list[Any]) -> int:
        """Publish the acks for ``windows`` (stored, or found already stored); returns messages handed to paho.

        Never raises: an ack that cannot be sent only makes the agent publish those windows again."""
        if not windows or client is None:
            return 0
        from edgekit_runtime.agent.telemetry import utc_timestamp
        from paho.mqtt.enums import MQTTErrorCode

        sent = 0
        for topic, payload in build_acks(windows, collector=self.collector, at=utc_timestamp()):
            try:
                info = client.publish(topic, payload, qos=ACK_QOS)
                ok = info.rc in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN)  # NO_CONN: queued
            except Exception as exc:  # noqa: BLE001 - an ack is an optimisation of redelivery, never fatal
                logger.debug("ack on %s not sent: %s", topic, exc)
                ok = False
            with self._lock:
                if ok:
                    self.published += 1
                    sent += 1
                else:
                    self.failed += 1
                    failed = self.failed
            if not ok and (failed <= 5 or failed % 1000 == 0):
                logger.warning("collector %s: cannot publish the ack on %s (%d so far); the device publishes those "
                               "windows again", self.collector, topic, failed)  # fmt: skip
        return sent


__all__ = ["ACK_QOS", "ACK_SCHEMA", "MAX_RANGES_PER_ACK", "StoredAcks", "build_acks", "seq_ranges"]
