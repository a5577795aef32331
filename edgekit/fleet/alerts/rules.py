"""Alert rules as validated data: a YAML file loaded into frozen, typed models.

An alert rules file (the shipped :data:`DEFAULT_RULES_PATH`, or a user's file given to
``edgekit fleet collect --alert-rules FILE``) names each rule and says what it watches::

    schema_version: 1
    evaluate_every: 5s
    rules:
      device-offline:
        kind: device_state
        states: [offline]
        for: 30s
        severity: critical
      p99-slow:
        kind: p99_above
        threshold_ms: 50
        for: 1m
        severity: warning
        labels: {team: vision}

Unknown keys are errors; every error names the file, the line, the rule and the field, and says how to fix it.
:func:`alert_rules_json_schema` is the JSON Schema editors check such files with (published next to this
module as ``alert_rules.schema.json``, kept current by a test).

``for`` is how long a condition must hold, evaluation after evaluation, before the rule fires (so one bad
telemetry window pages no one); it is written as Prometheus writes durations (``30s``, ``5m``, ``1h30m``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BeforeValidator, Field, ValidationError, field_validator

from edgekit.config import StrictModel, read_yaml, validation_message
from edgekit.errors import ConfigError

#: The rules shipped with edgekit (``fleet collect --alerts`` without a file of one's own).
DEFAULT_RULES_PATH = Path(__file__).resolve().parent / "default_rules.yaml"
#: The published JSON Schema of a rules file (a test keeps it equal to :func:`alert_rules_json_schema`).
SCHEMA_PATH = Path(__file__).resolve().parent / "alert_rules.schema.json"
#: Durations as Prometheus writes them: units from days down to milliseconds, largest first.
DURATION_PATTERN = r"^(0|([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?)$"
_DURATION_UNITS_S = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
#: Rule names: they become the ``alert`` of MQTT messages, events and Prometheus alerts.
RULE_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"
#: Alert labels edgekit sets itself (MQTT and webhook messages, the Prometheus rule file's ``edgekit_kind``), and the
#: labels of the fleet series the Prometheus rules read (a rule label of that name would replace the series' own).
RESERVED_LABELS = ("alertname", "severity", "fleet", "device", "edgekit_kind", "bundle", "target", "model", "stat", "state",
                   "job", "instance")
#: Severities, worst first (``active_alerts`` sorts by this order).
SEVERITIES = ("critical", "warning", "info")
#: Rollout states that count as failed for ``rollout_failed`` by default.
FAILED_ROLLOUT_STATES = ("rolled_back", "completed_with_failures")


class AlertRulesError(ConfigError):
    """An alert rules file is missing, unparsable or invalid."""


def duration_seconds(text: str) -> float:
    """Seconds in a Prometheus duration (``1h30m`` -> 5400.0); ``text`` must match :data:`DURATION_PATTERN`."""
    return sum(float(number) * _DURATION_UNITS_S[unit] for number, unit in re.findall(r"([0-9]+)(ms|d|h|m|s)", text))


def _check_duration(value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError(f"a duration needs its unit: write {value:g}s (or 5m, 1h30m), not {value!r}")
    if isinstance(value, str) and (not value or len(value) > 32 or not re.match(DURATION_PATTERN, value)):
        raise ValueError("not a duration: write it as Prometheus does, e.g. 30s, 5m, 1h30m (units d h m s ms, "
                         "largest first, no spaces)")
    return value


Duration = Annotated[str, BeforeValidator(_check_duration),
                     Field(pattern=DURATION_PATTERN, min_length=1, max_length=32,
                           description="a Prometheus duration: 30s, 5m, 1h30m, 0")]  # fmt: skip


class _RuleBase(StrictModel):
    for_: Duration = Field("0", alias="for", description="how long the condition must hold before the rule fires")
    severity: Literal["critical", "warning", "info"] = "warning"
    labels: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], Annotated[str, Field(max_length=256)]] = Field(
        default_factory=dict, description="extra labels carried by the alert (MQTT, webhook, Prometheus)")
    description: str | None = Field(None, max_length=1024, description="what the alert means and what to do")

    @property
    def for_s(self) -> float:
        """``for`` in seconds."""
        return duration_seconds(self.for_)

    @field_validator("labels")
    @classmethod
    def _no_reserved_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        reserved = sorted(set(labels) & set(RESERVED_LABELS))
        if reserved:
            raise ValueError(f"label(s) {', '.join(reserved)} are set by edgekit itself; rename them")
        return labels


class DeviceStateRule(_RuleBase):
    """Fires for a device whose liveness state (``edgekit.fleet.liveness``) is one of ``states``."""

    kind: Literal["device_state"]
    states: tuple[Literal["stale", "offline", "unknown"], ...] = Field(
        min_length=1, description="the liveness states that breach: stale (3 silent intervals), offline (10, or its last will)")


class P99AboveRule(_RuleBase):
    """Fires for a device whose newest window's p99 latency is above ``threshold_ms``."""

    kind: Literal["p99_above"]
    threshold_ms: float = Field(gt=0, description="p99 latency in milliseconds above which a device breaches")


class P99AboveFleetMedianRule(_RuleBase):
    """Fires for a device whose p99 is above ``factor`` x the median p99 of the devices of its fleet running its
    bundle on its target (the groups of Prometheus' ``edgekit_fleet_latency_p99_seconds``)."""

    kind: Literal["p99_above_fleet_median"]
    factor: float = Field(gt=1, description="how many times the bundle's fleet median p99 a device may reach")
    min_devices: int = Field(3, ge=2, description="devices that must run the bundle for its median to count")
    min_p99_ms: float = Field(0.0, ge=0, description="a p99 below this never breaches (ignores sub-millisecond noise)")


class ErrorRateAboveRule(_RuleBase):
    """Fires for a device whose newest window has more than ``share`` of its inferences failed (failed / (completed +
    failed), as rollout health gates count it)."""

    kind: Literal["error_rate_above"]
    share: float = Field(gt=0, lt=1, description="failed inferences / inferences of the newest window, from 0 to 1")
    min_inferences: int = Field(1, ge=1, description="windows with fewer inferences are not judged")


class TemperatureAboveRule(_RuleBase):
    """Fires for a device whose hottest thermal zone in its newest window is above ``threshold_c``."""

    kind: Literal["temperature_above"]
    threshold_c: float = Field(description="degrees Celsius")


class SpoolDiskFullRule(_RuleBase):
    """Fires for a device whose newest window reports ``spool.disk_full``: its outgoing queue cannot be written."""

    kind: Literal["spool_disk_full"]


class RolloutFailedRule(_RuleBase):
    """Fires for a rollout of the fleet whose record is in one of ``states`` and ended less than ``within`` ago."""

    kind: Literal["rollout_failed"]
    states: tuple[Literal["rolled_back", "completed_with_failures", "stopped"], ...] = Field(
        FAILED_ROLLOUT_STATES, min_length=1, description="rollout states that count as failed")
    within: Duration = Field("1h", description="a failed rollout is alerted on this long after it ended")

    @property
    def within_s(self) -> float:
        return duration_seconds(self.within)


AlertRule = Annotated[
    Union[DeviceStateRule, P99AboveRule, P99AboveFleetMedianRule, ErrorRateAboveRule, TemperatureAboveRule,
          SpoolDiskFullRule, RolloutFailedRule],
    Field(discriminator="kind"),
]  # fmt: skip
#: Every rule kind, by name (the engine's condition registry has one entry per kind; a test checks it).
RULE_KINDS: dict[str, type[_RuleBase]] = {
    model.model_fields["kind"].annotation.__args__[0]: model  # type: ignore[union-attr]
    for model in (DeviceStateRule, P99AboveRule, P99AboveFleetMedianRule, ErrorRateAboveRule, TemperatureAboveRule,
                  SpoolDiskFullRule, RolloutFailedRule)
}  # fmt: skip


class AlertRules(StrictModel):
    """A whole alert rules file: rule name -> rule, and how often the collector evaluates them."""

    schema_version: Literal[1] = 1
    evaluate_every: Duration = Field("5s", description="how often the collector evaluates the rules")
    rules: dict[Annotated[str, Field(pattern=RULE_NAME_PATTERN)], AlertRule] = Field(
        default_factory=dict, description="rule name -> rule")

    @property
    def evaluate_every_s(self) -> float:
        return duration_seconds(self.evaluate_every)

    @field_validator("evaluate_every")
    @classmethod
    def _positive_interval(cls, value: str) -> str:
        if duration_seconds(value) < 0.1:
            raise ValueError("evaluate_every must be at least 100ms")
        return value


class _CleanedErrors:
    """A ValidationError's errors without the union tag pydantic puts in each location (``rules.x.p99_above.y``
    reads ``rules.x.y``), for :func:`edgekit.config.validation_message`."""

    def __init__(self, exc: ValidationError) -> None:
        self._errors = []
        for err in exc.errors():
            loc = list(err["loc"])
            if len(loc) >= 3 and loc[0] == "rules" and loc[2] in RULE_KINDS:
                del loc[2]
            self._errors.append({**err, "loc": tuple(loc)})

    def errors(self) -> list[dict[str, Any]]:
        return self._errors


def load_alert_rules(path: Path | str = DEFAULT_RULES_PATH) -> AlertRules:
    """Read and validate an alert rules file; :class:`AlertRulesError` names the file, line, rule and field."""
    path = Path(path)
    data, positions = read_yaml(path, AlertRulesError, "alert rules file")
    if not isinstance(data, dict):
        raise AlertRulesError(f"{path}: an alert rules file must be a mapping with a 'rules' key, got {type(data).__name__}",
                              hint=f"see {DEFAULT_RULES_PATH} for an example")  # fmt: skip
    try:
        return AlertRules.model_validate(data)
    except ValidationError as exc:
        message, hint = validation_message(_CleanedErrors(exc), AlertRules, path, positions)  # type: ignore[arg-type]
        kinds = ", ".join(RULE_KINDS)
        raise AlertRulesError(f"invalid alert rules file:\n{message}",
                              hint=hint or f"see {DEFAULT_RULES_PATH} and {SCHEMA_PATH.name} for the fields of each kind ({kinds})") from None  # fmt: skip


def alert_rules_json_schema() -> dict[str, Any]:
    """The JSON Schema of an alert rules file, for editors and CI."""
    schema = AlertRules.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "edgekit alert rules"
    return schema


def alert_rules_schema_text() -> str:
    """The schema as :data:`SCHEMA_PATH` holds it: indented JSON ending in a newline."""
    return json.dumps(alert_rules_json_schema(), indent=2) + "\n"


__all__ = [
    "AlertRule", "AlertRules", "AlertRulesError", "DEFAULT_RULES_PATH", "DURATION_PATTERN", "DeviceStateRule",
    "ErrorRateAboveRule", "FAILED_ROLLOUT_STATES", "P99AboveFleetMedianRule", "P99AboveRule", "RULE_KINDS",
    "RolloutFailedRule", "SCHEMA_PATH", "SEVERITIES", "SpoolDiskFullRule", "TemperatureAboveRule",
    "alert_rules_json_schema", "alert_rules_schema_text", "duration_seconds", "load_alert_rules",
]  # fmt: skip
