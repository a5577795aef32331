"""build_telemetry / build_status / build_event turn runtime records into messages that validate."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone

import jsonschema
import pytest

from edgekit_runtime.agent.telemetry import (
    MAX_ERRORS,
    BundleRef,
    TelemetryProblem,
    build_event,
    build_status,
    encode_message,
    utc_timestamp,
)
from edgekit_runtime.agent.topics import TelemetryError
from edgekit_runtime.schemas import SchemaValidationError, load_schema
from edgekit_runtime.sensors.base import PowerIntegrator, PowerStats
from edgekit_runtime.sensors.none import NoPowerSensor
from tests.runtime.agent.sample_messages import WINDOW_START, sample_telemetry


def _validate(message: dict, name: str) -> None:
    jsonschema.Draft202012Validator(load_schema(name)).validate(message)


def test_full_telemetry_carries_the_records_values() -> None:
    message = sample_telemetry(42)
    _validate(message, "telemetry.v1")
    assert message["schema"] == "edgekit.telemetry/1"
    assert message["seq"] == 42
    assert message["bundle"] == {"id": "minilm-int8-2026.01", "sha256": "ab" * 32}
    assert message["window"] == {"start": "2026-01-02T03:04:05.678000Z", "end": "2026-01-02T03:04:15.678000Z"}
    latency = message["latency"]
    assert latency["count"] == 5 and latency["errors"] == 1
    assert latency["p50_ms"] == 3.0 and latency["max_ms"] == 12.0 and latency["mean_ms"] == pytest.approx(4.7)
    assert latency["queue_p50_ms"] == 0.2
    assert latency["throughput_per_s"] == pytest.approx(0.5)  # 5 inferences in 10 s
    # Trapezoid over 5 W -> 7 W for 10 s = 60 J; 5 inferences -> 12 J each.
    assert message["power"] == {"mean_mw": 6000.0, "max_mw": 7000.0, "energy_mj": 60000.0,
                                "source": "ina3221 VDD_IN", "reason": None}  # fmt: skip
    assert message["energy_per_inference_mj"] == pytest.approx(12000.0)
    assert message["temperatures_c"] == {"cpu-thermal": 48.5, "gpu-thermal": 46.0, "soc0": 47.25}
    assert message["memory"] == {"used_mb": 2048.0, "total_mb": 7620.0, "rss_mb": 180.5}
    assert message["cpu_load_pct"] == 35.5 and message["gpu_load_pct"] == 12.0
    assert message["errors"] == [{"code": "inference.failed",
                                  "message": "input 'image' has shape [1, 3] but needs [1, 1, 8, 8]"}]  # fmt: skip
    assert message["spool"] == {"dropped": 0, "backlog": 0}
    assert json.loads(encode_message(message)) == message


def test_missing_measurements_are_null_never_invented() -> None:
    integrator = PowerIntegrator.for_sensor(NoPowerSensor())
    message = sample_telemetry(1, latency=None, queue_latency=None, failed_inferences=0, device_state=None,
                               rss_mb=None, bundle=None, errors=[], power=integrator.take_window())  # fmt: skip
    _validate(message, "telemetry.v1")
    assert message["bundle"] is None
    assert message["latency"]["count"] == 0
    assert all(message["latency"][k] is None for k in ("p50_ms", "p99_ms", "max_ms", "queue_p99_ms"))
    assert message["latency"]["throughput_per_s"] == 0.0
    assert message["power"]["mean_mw"] is None and message["power"]["energy_mj"] is None
    assert message["power"]["reason"] == "no samples in the window"
    assert message["energy_per_inference_mj"] is None
    assert message["memory"] == {"used_mb": None, "total_mb": None, "rss_mb": None}
    assert message["cpu_load_pct"] is None and message["gpu_load_pct"] is None
    assert message["temperatures_c"] == {}


def test_non_finite_numbers_become_null() -> None:
    power = PowerStats(math.inf, math.nan, None, 1.0, 3, "rapl package-0", reason=None)
    message = sample_telemetry(2, power=power, window_end=WINDOW_START, rss_mb=math.nan)
    assert message["power"]["mean_mw"] is None and message["power"]["max_mw"] is None
    assert message["latency"]["throughput_per_s"] is None  # a zero-length window has no rate
    assert message["memory"]["rss_mb"] is None


def test_more_errors_than_fit_are_truncated_with_a_note() -> None:
    problems = [TelemetryProblem("sensor.read_failed", f"read {i} failed") for i in range(MAX_ERRORS + 10)]
    message = sample_telemetry(3, errors=problems)
    assert len(message["errors"]) == MAX_ERRORS
    assert message["errors"][-1] == {"code": "errors_truncated", "message": "11 more errors left out"}
    long = sample_telemetry(4, errors=[TelemetryProblem("x", "y" * 5000)])
    assert len(long["errors"][0]["message"]) == 1024


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"seq": 0}, r"telemetry seq must be an int >= 1, got 0"),
        ({"seq": "7"}, r"telemetry seq must be an int >= 1, got '7'"),
        ({"spool_backlog": -1}, r"telemetry spool_backlog must be an int >= 0, got -1"),
        ({"window_start": datetime(2026, 1, 1)}, r"timestamp 2026-01-01T00:00:00 has no time zone"),
        ({"window_end": WINDOW_START - timedelta(seconds=1)}, r"telemetry window ends \(2026-01-02T03:04:04"),
        ({"device": "lab/dev-1"}, r"device id 'lab/dev-1' contains '/' \(MQTT's level separator\)"),
        ({"fleet": ""}, r"fleet id is empty"),
    ],
)
def test_bad_telemetry_inputs_are_named(overrides: dict, expected: str) -> None:
    with pytest.raises(TelemetryError, match=expected):
        sample_telemetry(**{"seq": 1, **overrides})


def test_bad_records_are_refused_where_they_are_made() -> None:
    with pytest.raises(TelemetryError, match=r"bundle 'b1': sha256 must be 64 lowercase hex digits, got 'ABC'"):
        BundleRef("b1", "ABC")
    with pytest.raises(TelemetryError, match=r"telemetry error code 'Sensor Failed' is invalid"):
        TelemetryProblem("Sensor Failed", "x")


def test_a_message_the_schema_refuses_raises_schema_validation_error() -> None:
    with pytest.raises(SchemaValidationError, match=r"telemetry message seq 5 does not match schema telemetry\.v1: "
                       r"agent_version: '' is shorter than 1 characters"):  # fmt: skip
        sample_telemetry(5, agent_version="")


def test_status_and_event_messages_validate() -> None:
    at = datetime(2026, 5, 6, 7, 8, 9, tzinfo=timezone(timedelta(hours=2)))
    status = build_status(device="dev-1", fleet="lab", state="online", bundle=BundleRef("b", "0" * 64), at=at)
    _validate(status, "status.v1")
    assert status["at"] == "2026-05-06T05:08:09.000000Z"  # converted to UTC
    assert status["state"] == "online" and status["reason"] is None
    event = build_event(device="dev-1", fleet="lab", kind="deploy_result", message="deployed b", level="info",
                        command_id="c-9", details={"bundle_id": "b", "duration_s": 3.5})  # fmt: skip
    _validate(event, "event.v1")
    assert len(event["event_id"]) == 32 and event["command_id"] == "c-9"
    with pytest.raises(SchemaValidationError, match=r"kind: 'Deploy Result' does not match"):
        build_event(device="dev-1", fleet="lab", kind="Deploy Result", message="x")
    with pytest.raises(SchemaValidationError, match=r"state: 'asleep' is not one of \['online', 'offline'\]"):
        build_status(device="dev-1", fleet="lab", state="asleep")  # type: ignore[arg-type]


def test_encode_refuses_nan_with_a_hint() -> None:
    with pytest.raises(TelemetryError, match=r"cannot be encoded as JSON") as info:
        encode_message({"x": math.nan})
    assert "replace non-finite numbers with None" in str(info.value)


def test_utc_timestamp_defaults_to_now() -> None:
    stamp = utc_timestamp()
    parsed = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    assert abs((datetime.now(timezone.utc) - parsed).total_seconds()) < 5
