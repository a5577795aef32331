"""parse_message: real agent messages become records; everything else becomes a Rejection with a reason,
and nothing ever raises (fuzzed with hypothesis)."""

from __future__ import annotations

import copy
import datetime as dt
import json
from collections import Counter
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgekit.fleet.ingest import MAX_PAYLOAD_BYTES, REJECTION_REASONS, Rejection, _schema_problem, parse_message
from edgekit.fleet.store.base import DeviceEvent, DeviceStatus, TelemetryWindow
from edgekit_runtime.agent.telemetry import encode_message
from edgekit_runtime.schemas import load_schema
from tests.fleet.messages import BUNDLE_A, T0, event, status, telemetry, topic

AT = dt.datetime(2026, 3, 1, 13, 0, tzinfo=dt.timezone.utc)


def test_telemetry_becomes_a_flat_window() -> None:
    message = telemetry(7, latencies_ms=[1.0, 2.0, 3.0, 4.0], power_mw=4000.0, temperature_c=61.5)
    record = parse_message(topic("telemetry"), encode_message(message), received_at=AT)
    assert isinstance(record, TelemetryWindow)
    assert (record.fleet, record.device, record.seq) == ("lab", "dev-1", 7)
    assert record.window_start == T0 + dt.timedelta(seconds=60)
    assert record.window_end - record.window_start == dt.timedelta(seconds=10)
    assert record.received_at == AT
    assert (record.bundle_id, record.bundle_sha256) == (BUNDLE_A.id, BUNDLE_A.sha256)
    assert record.count == 4 and record.errors == 0
    assert record.p50_ms == message["latency"]["p50_ms"] and record.p99_ms == message["latency"]["p99_ms"]
    assert record.power_mean_mw == pytest.approx(4000.0)
    assert record.energy_mj == pytest.approx(40000.0)
    assert record.energy_per_inference_mj == pytest.approx(10000.0)
    assert record.temperature_max_c == 61.5
    assert record.payload == message and json.loads(record.payload_json or "") == message


def test_numbers_with_exponents_in_range_are_read_as_written() -> None:
    # floats are checked for overflow only where a number has an exponent (or 300 digits): this one takes that path
    p99 = GOOD["latency"]["p99_ms"]
    payload = _changed(GOOD, "latency.p99_ms", p99).replace(f'"p99_ms": {p99!r}'.encode(), f'"p99_ms": {p99:e}'.encode())
    assert f"{p99:e}".encode() in payload
    result = parse_message(topic("telemetry"), payload, received_at=AT)
    assert isinstance(result, TelemetryWindow), result
    assert result.p99_ms == float(f"{p99:e}")


def test_status_and_event_become_records() -> None:
    online = parse_message(topic("status"), encode_message(status("online", bundle=BUNDLE_A)), received_at=AT)
    assert isinstance(online, DeviceStatus)
    assert (online.state, online.bundle_id, online.updated_at) == ("online", BUNDLE_A.id, AT)
    deployed = event("deploy_result", command_id="c-9", details={"outcome": "deployed"})
    record = parse_message(topic("events"), json.dumps(deployed))
    assert isinstance(record, DeviceEvent)
    assert (record.event_id, record.kind, record.command_id) == (deployed["event_id"], "deploy_result", "c-9")


def _changed(message: dict[str, Any], path: str, value: Any) -> bytes:
    changed = copy.deepcopy(message)
    *parents, leaf = path.split(".")
    node = changed
    for part in parents:
        node = node[part]
    node[leaf] = value
    return json.dumps(changed).encode()


GOOD = telemetry(3)
BAD_INPUTS = [
    # (topic, payload, reason, words the detail must contain)
    (topic("telemetry"), b"x" * (MAX_PAYLOAD_BYTES + 1), "oversized", f"over the limit of {MAX_PAYLOAD_BYTES} bytes"),
    ("edgekit/v1/lab/telemetry", encode_message(GOOD), "bad_topic", "not an edgekit v1 device topic"),
    (topic("cmd"), encode_message(GOOD), "bad_topic", "does not read 'cmd' topics"),
    ("edgekit/v1/la+b/dev-1/telemetry", encode_message(GOOD), "bad_topic", "'+'"),
    (topic("telemetry"), b"\xff\xfe{}", "not_utf8", "not UTF-8"),
    (topic("telemetry"), b'{"schema": "edgekit.telemetry/1", ', "malformed_json", "Expecting"),
    (topic("telemetry"), b'{"seq": NaN}', "malformed_json", "NaN is not a JSON number"),
    (topic("telemetry"), b'{"seq": 1e999}', "malformed_json", "out of range"),
    # a float that overflows inside a real window, with an exponent and as 400 plain digits (no exponent to see)
    (topic("telemetry"), encode_message(GOOD).replace(b'"p99_ms":', b'"p99_ms": -2E+400, "x":'), "malformed_json",
     "out of range"),
    (topic("telemetry"), encode_message(GOOD).replace(b'"p99_ms":', b'"p99_ms": ' + b"9" * 400 + b'.5, "x":'),
     "malformed_json", "out of range"),
    (topic("telemetry"), b"[" * 100_000 + b"]" * 100_000, "malformed_json", "nested too deeply"),
    (topic("telemetry"), b"[1, 2]", "not_an_object", "JSON list"),
    (topic("telemetry"), b"{}", "unknown_schema", "no 'schema' field"),
    (topic("telemetry"), _changed(GOOD, "schema", "edgekit.telemetry/2"), "unknown_schema", "'edgekit.telemetry/2'"),
    (topic("telemetry"), _changed(GOOD, "schema", ["edgekit.telemetry/1"]), "unknown_schema", "schema is ['edgekit"),
    (topic("telemetry"), encode_message(status()), "wrong_topic", "edgekit.status/1 message arrived on a 'telemetry'"),
    (topic("telemetry"), _changed(GOOD, "seq", "3"), "schema_mismatch", "seq must be integer"),
    (topic("telemetry"), _changed(GOOD, "latency.p99_ms", -1.0), "schema_mismatch", "p99_ms"),
    (topic("telemetry"), _changed(GOOD, "bogus", 1), "schema_mismatch", "must not contain"),
    (topic("telemetry", device="dev-2"), encode_message(GOOD), "device_mismatch", "device 'dev-1'"),
    (topic("telemetry", fleet="other"), encode_message(GOOD), "device_mismatch", "fleet 'lab'"),
    (topic("telemetry"), _changed(GOOD, "seq", 2**63), "bad_value", "larger than a 64-bit integer"),
    (topic("telemetry"), _changed(GOOD, "window.start", "2026-13-01T00:00:00Z"), "bad_value", "not a real time"),
    (topic("telemetry"), _changed(GOOD, "window.start", "2026-03-02T00:00:00Z"), "bad_value", "ends"),
    (topic("telemetry"), _changed(GOOD, "agent_version", "0.1\u0000"), "bad_value", "NUL character"),
    (topic("events"), json.dumps(event(), ensure_ascii=False).replace("deployed", "\ud800").encode("utf-8", "surrogatepass"),
     "not_utf8", "not UTF-8"),
    (topic("events"), json.dumps(event(message="x")).replace('"x"', '"\\ud800"').encode(), "bad_value", "surrogate"),
    (topic("events"), encode_message(event("alert_firing")), "reserved_kind",
     "event kind 'alert_firing' is reserved for the collector's alerts; a device's event kinds must not start with 'alert_'"),
]  # fmt: skip


@pytest.mark.parametrize(("topic_name", "payload", "reason", "detail"), BAD_INPUTS,
                         ids=[f"{case[2]}-{index}" for index, case in enumerate(BAD_INPUTS)])  # fmt: skip
def test_bad_messages_are_rejected_with_a_reason(topic_name: str, payload: bytes, reason: str, detail: str) -> None:
    result = parse_message(topic_name, payload, received_at=AT)
    assert isinstance(result, Rejection), result
    assert result.reason == reason, result.detail
    assert detail in result.detail
    assert result.topic == topic_name and result.size_bytes == len(payload) and result.received_at == AT
    record = result.to_record()
    assert (record.reason, record.detail, record.size_bytes) == (reason, result.detail, len(payload))


def test_every_reason_except_the_collectors_own_is_exercised() -> None:
    tested = {case[2] for case in BAD_INPUTS}
    assert set(REJECTION_REASONS) - tested == {"store_refused", "internal_error"}


def test_max_payload_bytes_is_configurable() -> None:
    payload = encode_message(GOOD)
    assert isinstance(parse_message(topic("telemetry"), payload, max_payload_bytes=len(payload)), TelemetryWindow)
    small = parse_message(topic("telemetry"), payload, max_payload_bytes=len(payload) - 1)
    assert isinstance(small, Rejection) and small.reason == "oversized"


# -- fuzzing ------------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)  # fmt: skip
FIELD_PATHS = ["seq", "device", "fleet", "schema", "agent_version", "bundle", "bundle.id", "bundle.sha256", "window",
               "window.start", "window.end", "latency", "latency.count", "latency.p50_ms", "latency.p99_ms", "power",
               "power.mean_mw", "power.energy_mj", "energy_per_inference_mj", "temperatures_c", "memory.used_mb",
               "cpu_load_pct", "errors", "spool.dropped"]  # fmt: skip
TOPICS = st.sampled_from([topic("telemetry"), topic("status"), topic("events"), topic("cmd"), "edgekit/v1/lab/dev-1",
                          "", "#", "edgekit/v1/+/dev-1/telemetry"]) | st.text(max_size=40)  # fmt: skip


def _mutated(message: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(message)
    *parents, leaf = path.split(".")
    node: Any = changed
    for part in parents:
        if not isinstance(node, dict) or not isinstance(node.get(part), dict):
            return changed
        node = node[part]
    node[leaf] = value
    return changed


def _encode(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode("utf-8", "surrogatepass")


PAYLOADS = st.one_of(
    st.binary(max_size=300),  # arbitrary bytes
    st.text(max_size=200).map(lambda text: text.encode("utf-8", "surrogatepass")),  # arbitrary text, mostly bad JSON
    JSON_VALUES.map(_encode),  # valid JSON of any shape
    st.builds(_mutated, st.just(GOOD), st.sampled_from(FIELD_PATHS), JSON_VALUES).map(_encode),  # wrong types
    st.builds(_mutated, st.sampled_from([status(), event(details={"step": "x"})]),
              st.sampled_from(["state", "at", "bundle", "reason", "event_id", "kind", "level", "message", "command_id",
                               "details", "details.step", "device", "agent_version"]), JSON_VALUES).map(_encode),
    st.builds(lambda version: _encode({**GOOD, "schema": version}),
              st.text(max_size=30) | st.integers().map(lambda n: f"edgekit.telemetry/{n}")),  # unknown versions
    st.integers(min_value=MAX_PAYLOAD_BYTES + 1, max_value=MAX_PAYLOAD_BYTES + 4096).map(lambda n: b"{" * n),  # huge
    st.sampled_from([encode_message(GOOD), encode_message(status()), encode_message(event())]),  # good ones too
)  # fmt: skip


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(messages=st.lists(st.tuples(TOPICS, PAYLOADS), min_size=1, max_size=8))
def test_fuzzed_messages_never_raise_and_every_one_is_counted(messages: list[tuple[str, bytes]]) -> None:
    counts: Counter[str] = Counter()
    for topic_name, payload in messages:
        result = parse_message(topic_name, payload, received_at=AT)
        if isinstance(result, Rejection):
            assert result.reason in REJECTION_REASONS and result.reason != "internal_error", result
            assert result.detail and len(result.detail) <= 512
            counts[result.reason] += 1
        else:
            assert isinstance(result, (TelemetryWindow, DeviceStatus, DeviceEvent))
            assert (result.fleet, result.device) == tuple(topic_name.split("/")[2:4])
            counts["accepted"] += 1
    assert sum(counts.values()) == len(messages)


@settings(max_examples=300, deadline=None)
@given(path=st.sampled_from(FIELD_PATHS), value=JSON_VALUES)
def test_compiled_validator_agrees_with_jsonschema(path: str, value: Any) -> None:
    """The collector validates with fastjsonschema; jsonschema (the reference) must reach the same verdict."""
    message = _mutated(GOOD, path, value)
    reference = jsonschema.Draft202012Validator(load_schema("telemetry.v1")).is_valid(message)
    assert (_schema_problem("telemetry.v1", message) is None) == reference, message


def test_local_refs_are_inlined_for_the_compiled_validator() -> None:
    from edgekit.fleet.ingest import _inline_refs

    for name in ("telemetry.v1", "status.v1", "event.v1"):
        schema = load_schema(name)
        inlined = _inline_refs(schema)
        assert "$ref" not in json.dumps(inlined) and "$defs" not in inlined
        assert inlined["properties"].keys() == schema["properties"].keys()
    recursive = {"$defs": {"node": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "$ref": "#/$defs/node"}
    assert _inline_refs(recursive) is recursive  # left for fastjsonschema to resolve
    remote = {"properties": {"a": {"$ref": "https://example.com/a.json"}}}
    assert _inline_refs(remote) is remote
    constrained = {"$defs": {"id": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/id", "minLength": 3}}}
    assert _inline_refs(constrained) is constrained  # a sibling that validates: not merged


@pytest.mark.parametrize("field, value", [("at", "2026-03-01T12:00:00Z"), ("at", "2026-03-01 12:00:00"), ("at", 5),
                                          ("device", "dev/1"), ("device", ""), ("fleet", "x" * 65), ("state", "gone")])
def test_status_validation_agrees_with_jsonschema(field: str, value: Any) -> None:
    message = {**status("online"), field: value}
    reference = jsonschema.Draft202012Validator(load_schema("status.v1")).is_valid(message)
    assert (_schema_problem("status.v1", message) is None) == reference, message
