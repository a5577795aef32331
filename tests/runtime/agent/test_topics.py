"""Topic names and the ids that go into them."""

from __future__ import annotations

import pytest

from edgekit_runtime.agent.topics import (
    QOS_BY_KIND,
    TOPIC_KINDS,
    DeviceTopics,
    TelemetryError,
    parse_topic,
    subscription,
    validate_id,
)


def test_device_topics() -> None:
    topics = DeviceTopics("lab", "orin-01")
    assert topics.telemetry == "edgekit/v1/lab/orin-01/telemetry"
    assert topics.status == "edgekit/v1/lab/orin-01/status"
    assert topics.events == "edgekit/v1/lab/orin-01/events"
    assert topics.cmd == "edgekit/v1/lab/orin-01/cmd"
    assert set(QOS_BY_KIND) == set(TOPIC_KINDS) and set(QOS_BY_KIND.values()) == {1}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", r"device id is empty"),
        ("a+b", r"device id 'a\+b' contains '\+' \(MQTT's single-level wildcard\)"),
        ("a#", r"device id 'a#' contains '#' \(MQTT's multi-level wildcard\)"),
        ("a/b", r"device id 'a/b' contains '/' \(MQTT's level separator\)"),
        ("a\nb", r"device id 'a\\nb' contains a control character"),
        ("x" * 65, r"is 65 characters, more than 64"),
        (7, r"device id must be a string, got int 7"),
    ],
)
def test_bad_ids_are_refused_with_the_reason(value: object, expected: str) -> None:
    with pytest.raises(TelemetryError, match=expected) as info:
        validate_id(value)
    assert "use letters, digits" in str(info.value)


def test_ids_at_the_limit_pass() -> None:
    assert validate_id("x" * 64) == "x" * 64
    with pytest.raises(TelemetryError, match=r"fleet id 'a\+' contains"):
        DeviceTopics("a+", "dev")


def test_parse_topic_round_trips_and_refuses_others() -> None:
    parsed = parse_topic(DeviceTopics("lab", "dev-1").events)
    assert (parsed.fleet, parsed.device, parsed.kind) == ("lab", "dev-1", "events")
    for bad in ("edgekit/v2/lab/dev/telemetry", "edgekit/v1/lab/dev/other", "edgekit/v1/lab/telemetry"):
        with pytest.raises(TelemetryError, match="is not an edgekit v1 device topic"):
            parse_topic(bad)


def test_collector_subscriptions() -> None:
    assert subscription("telemetry") == "edgekit/v1/+/+/telemetry"
    assert subscription("status", fleet="lab") == "edgekit/v1/lab/+/status"
    with pytest.raises(TelemetryError, match=r"unknown topic kind 'logs'"):
        subscription("logs")  # type: ignore[arg-type]
