"""Alert rules as validated data: the shipped file loads, mistakes are named (file, line, rule, field, fix),
the published JSON Schema is current and accepts the shipped file, and every rule kind has a condition."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from edgekit.errors import ConfigError
from edgekit.fleet.alerts.conditions import CONDITIONS
from edgekit.fleet.alerts.prometheus import EXPRESSIONS, NOT_IN_PROMETHEUS
from edgekit.fleet.alerts.rules import (
    DEFAULT_RULES_PATH,
    RULE_KINDS,
    SCHEMA_PATH,
    AlertRulesError,
    alert_rules_json_schema,
    alert_rules_schema_text,
    duration_seconds,
    load_alert_rules,
)
from edgekit_runtime.yaml_limited import parse_yaml_limited


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    return path


def test_shipped_rules_load_with_every_kind() -> None:
    rules = load_alert_rules()
    assert {rule.kind for rule in rules.rules.values()} == set(RULE_KINDS)
    offline = rules.rules["device-offline"]
    assert offline.kind == "device_state" and offline.states == ("offline",) and offline.for_s == 60.0
    assert offline.severity == "critical"
    assert rules.evaluate_every_s == 5.0
    with pytest.raises(Exception):  # frozen
        offline.severity = "info"  # type: ignore[misc]


def test_every_kind_has_a_condition_and_a_prometheus_rule_or_a_reason() -> None:
    assert set(CONDITIONS) == set(RULE_KINDS)
    assert set(EXPRESSIONS) | set(NOT_IN_PROMETHEUS) == set(RULE_KINDS)
    assert not set(EXPRESSIONS) & set(NOT_IN_PROMETHEUS)


@pytest.mark.parametrize(("text", "seconds"), [("0", 0.0), ("30s", 30.0), ("5m", 300.0), ("1h30m", 5400.0),
                                               ("1d", 86400.0), ("1500ms", 1.5), ("2m30s", 150.0)])  # fmt: skip
def test_durations_read_as_prometheus_writes_them(text: str, seconds: float) -> None:
    assert duration_seconds(text) == seconds


def test_mistakes_name_the_file_line_rule_field_and_fix(tmp_path: Path) -> None:
    path = _write(tmp_path, "schema_version: 1\nrules:\n  p99-slow:\n    kind: p99_above\n    treshold_ms: 50\n"
                            "  hot:\n    kind: temperature_above\n    threshold_c: 80\n    for: 5 minutes\n")  # fmt: skip
    with pytest.raises(AlertRulesError) as info:
        load_alert_rules(path)
    message, hint = info.value.message, info.value.hint or ""
    assert isinstance(info.value, ConfigError)
    assert f"{path}:5:5: unknown key 'treshold_ms' in rules.p99-slow (did you mean 'threshold_ms'?)" in message
    assert "missing required field 'rules.p99-slow.threshold_ms'" not in message  # the typo explains it: said once
    assert f"{path}:9:5: field 'rules.hot.for'" in message and "e.g. 30s, 5m, 1h30m" in message
    assert "rename 'treshold_ms' to 'threshold_ms'" in hint


def test_an_unknown_kind_lists_the_kinds(tmp_path: Path) -> None:
    path = _write(tmp_path, "rules:\n  x:\n    kind: cpu_above\n    for: 1m\n")
    with pytest.raises(AlertRulesError) as info:
        load_alert_rules(path)
    assert f"{path}:2:3: field 'rules.x.kind': unknown kind 'cpu_above'" in info.value.message
    assert "did you mean 'p99_above'? 'kind' is one of: device_state, p99_above," in (info.value.hint or "")


@pytest.mark.parametrize(("body", "expected"), [
    ("rules:\n  x:\n    kind: error_rate_above\n    share: 5\n", "field 'rules.x.share': Input should be less than 1"),
    ("rules:\n  x:\n    kind: p99_above_fleet_median\n    factor: 0.5\n", "field 'rules.x.factor': Input should be greater than 1"),
    ("rules:\n  x:\n    kind: device_state\n    states: [asleep]\n", "field 'rules.x.states[0]'"),
    ("rules:\n  x:\n    kind: spool_disk_full\n    severity: page\n", "field 'rules.x.severity'"),
    ("rules:\n  x:\n    kind: spool_disk_full\n    labels: {fleet: a}\n", "'rules.x.labels': Value error, label(s) fleet are set by edgekit itself"),
    ("rules:\n  x:\n    kind: p99_above\n    threshold_ms: 50\n    labels: {edgekit_kind: mine}\n",
     "rules.yaml:5:5: field 'rules.x.labels': Value error, label(s) edgekit_kind are set by edgekit itself; rename them"),
    ("rules:\n  x:\n    kind: p99_above\n    threshold_ms: 50\n    labels: {bundle: mine, team: ml}\n",  # a series' own label
     "rules.yaml:5:5: field 'rules.x.labels': Value error, label(s) bundle are set by edgekit itself; rename them"),
    ("rules:\n  'bad name':\n    kind: spool_disk_full\n", "rules.bad name"),
    ("evaluate_every: 50ms\nrules: {}\n", "evaluate_every must be at least 100ms"),
    ("rules:\n  x:\n    kind: spool_disk_full\n    for: 30\n", "'rules.x.for': Value error, a duration needs its unit: write 30s"),
    ("schema_version: 2\nrules: {}\n", "field 'schema_version'"),
    ("- a\n- b\n", "must be a mapping with a 'rules' key"),
])  # fmt: skip
def test_invalid_values_are_refused_by_name(tmp_path: Path, body: str, expected: str) -> None:
    with pytest.raises(AlertRulesError) as info:
        load_alert_rules(_write(tmp_path, body))
    assert expected in info.value.message
    assert str(tmp_path / "rules.yaml") in info.value.message


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(AlertRulesError) as info:
        load_alert_rules(tmp_path / "nope.yaml")
    assert "nope.yaml" in info.value.message


def test_published_schema_is_current_and_accepts_the_shipped_rules() -> None:
    assert SCHEMA_PATH.read_text() == alert_rules_schema_text(), (
        f"{SCHEMA_PATH} is out of date: run python -c 'from edgekit.fleet.alerts.rules import *; "
        "SCHEMA_PATH.write_text(alert_rules_schema_text())'")
    schema = json.loads(SCHEMA_PATH.read_text())
    assert schema == alert_rules_json_schema() and schema["title"] == "edgekit alert rules"
    data, _ = parse_yaml_limited(DEFAULT_RULES_PATH.read_bytes(), DEFAULT_RULES_PATH, ConfigError, "rules")
    jsonschema.Draft202012Validator(schema).validate(data)
    bad = dict(data, rules={"x": {"kind": "p99_above", "threshold_ms": 5, "treshold": 1}})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(bad)
