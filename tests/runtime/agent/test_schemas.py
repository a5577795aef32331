"""The message schemas load from the package and the runtime's small validator agrees with jsonschema."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest

from edgekit_runtime.agent.telemetry import build_event, build_status
from edgekit_runtime.errors import EdgekitError, InternalError
from edgekit_runtime.schemas import SCHEMA_NAMES, SchemaValidationError, load_schema, schema_problems, validate_message
from edgekit_runtime.schemas.validator import check_supported, iter_errors
from tests.runtime.agent.sample_messages import sample_telemetry

PING = {"schema": "edgekit.command/1", "id": "c-1", "command": "ping"}
DEPLOY = {"schema": "edgekit.command/1", "id": "c-2", "command": "deploy", "issued_at": "2026-01-02T03:04:05Z",
          "args": {"bundle_id": "b1", "url": "https://fleet.example/b1.tar", "sha256": "0" * 64}}  # fmt: skip


def _with(message: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(message)
    *parents, leaf = path.split(".")
    node = changed
    for part in parents:
        node = node[part]
    if value is _DELETE:
        del node[leaf]
    else:
        node[leaf] = value
    return changed


_DELETE = object()


def _cases() -> list[tuple[str, Any]]:
    telemetry = sample_telemetry(7)
    status = build_status(device="dev-1", fleet="lab", state="offline", reason="agent stopped")
    event = build_event(device="dev-1", fleet="lab", kind="deploy_result", message="deployed b1",
                        details={"bundle_id": "b1"})  # fmt: skip
    return [
        ("telemetry.v1", telemetry),
        ("telemetry.v1", _with(telemetry, "seq", 0)),
        ("telemetry.v1", _with(telemetry, "seq", True)),
        ("telemetry.v1", _with(telemetry, "seq", 3.0)),
        ("telemetry.v1", _with(telemetry, "extra", 1)),
        ("telemetry.v1", _with(telemetry, "power", _DELETE)),
        ("telemetry.v1", _with(telemetry, "power.mean_mw", -1.0)),
        ("telemetry.v1", _with(telemetry, "power.mean_mw", None)),
        ("telemetry.v1", _with(telemetry, "latency.p99_ms", "3 ms")),
        ("telemetry.v1", _with(telemetry, "window.start", "2026-01-02 03:04:05")),
        ("telemetry.v1", _with(telemetry, "device", "a/b")),
        ("telemetry.v1", _with(telemetry, "device", "x" * 65)),
        ("telemetry.v1", _with(telemetry, "bundle", None)),
        ("telemetry.v1", _with(telemetry, "bundle.sha256", "AB" * 32)),
        ("telemetry.v1", _with(telemetry, "temperatures_c.cpu", "hot")),
        ("telemetry.v1", _with(telemetry, "errors", [{"code": "Bad Code", "message": "x"}])),
        ("telemetry.v1", _with(telemetry, "errors", [{"code": "ok"}] * 70)),
        ("telemetry.v1", _with(telemetry, "schema", "edgekit.telemetry/2")),
        ("telemetry.v1", [telemetry]),
        ("status.v1", status),
        ("status.v1", _with(status, "state", "sleeping")),
        ("status.v1", _with(status, "at", None)),
        ("event.v1", event),
        ("event.v1", _with(event, "level", "fatal")),
        ("event.v1", _with(event, "event_id", "nope")),
        ("event.v1", _with(event, "details", [])),
        ("command.v1", PING),
        ("command.v1", DEPLOY),
        ("command.v1", _with(DEPLOY, "args.sha256", "xyz")),
        ("command.v1", _with(DEPLOY, "args.url", "ftp://x")),
        ("command.v1", _with(DEPLOY, "args", _DELETE)),
        ("command.v1", _with(PING, "command", "reboot")),
        ("command.v1", _with(PING, "args", {"x": 1})),
        ("command.v1", {**PING, "command": "set_interval", "args": {"interval_s": 30}}),
        ("command.v1", {**PING, "command": "set_interval", "args": {"interval_s": 0.5}}),
        ("command.v1", {**PING, "command": "set_interval"}),
        ("command.v1", {**PING, "command": "rollback"}),
        ("command.v1", {**PING, "command": "rollback", "args": {"bundle_id": ""}}),
        ("command.v1", {"id": "x"}),
        ("command.v1", "ping"),
    ]


@pytest.mark.parametrize(("name", "instance"), _cases())
def test_runtime_validator_agrees_with_jsonschema(name: str, instance: Any) -> None:
    schema = load_schema(name)
    expected_valid = jsonschema.Draft202012Validator(schema).is_valid(instance)
    problems = schema_problems(instance, name)
    assert (problems == []) is expected_valid, problems


def test_every_schema_is_valid_draft_2020_12_and_uses_only_supported_keywords() -> None:
    for name in SCHEMA_NAMES:
        schema = load_schema(name)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        jsonschema.Draft202012Validator.check_schema(schema)
        check_supported(schema)
        assert schema["additionalProperties"] is False
    assert load_schema("telemetry.v1.json") == load_schema("telemetry.v1")


def test_load_schema_returns_a_copy() -> None:
    schema = load_schema("status.v1")
    schema["required"].clear()
    assert load_schema("status.v1")["required"]


def test_unknown_schema_name_lists_the_known_ones() -> None:
    with pytest.raises(EdgekitError, match=r"unknown message schema 'telemetry\.v2'") as info:
        load_schema("telemetry.v2")
    assert "telemetry.v1, status.v1, event.v1, command.v1" in str(info.value)


def test_validate_message_names_each_problem_with_its_path() -> None:
    message = _with(_with(sample_telemetry(3), "latency.p50_ms", -2.0), "spool", _DELETE)
    with pytest.raises(SchemaValidationError) as info:
        validate_message(message, "telemetry.v1", what="telemetry message seq 3")
    text = str(info.value)
    assert "telemetry message seq 3 does not match schema telemetry.v1" in text
    assert "latency.p50_ms: -2.0 is less than the minimum of 0" in text
    assert "(root): required property 'spool' is missing" in text
    assert "telemetry.v1.json" in text
    assert len(info.value.problems) == 2


def test_validator_refuses_keywords_it_does_not_implement() -> None:
    with pytest.raises(InternalError, match=r"'patternProperties' at #/properties/a is not supported"):
        check_supported({"type": "object", "properties": {"a": {"patternProperties": {}}}})


def test_schema_files_ship_as_package_data() -> None:
    from importlib import resources

    names = {p.name for p in resources.files("edgekit_runtime.schemas").iterdir() if p.name.endswith(".json")}
    assert {f"{name}.json" for name in SCHEMA_NAMES} <= names
    for name in SCHEMA_NAMES:
        json.loads(resources.files("edgekit_runtime.schemas").joinpath(f"{name}.json").read_text())


def test_const_and_enum_use_json_equality() -> None:
    assert list(iter_errors(True, {"const": 1})) == ["(root): expected 1, got True"]
    assert list(iter_errors(1.0, {"enum": [1]})) == []
