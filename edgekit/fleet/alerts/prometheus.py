"""The alert rules as a Prometheus rule file, on the fleet-level series of ``deploy/prometheus/METRICS.md``.

``python -m edgekit.fleet.alerts.prometheus [--rules FILE] [--out deploy/prometheus/rules.yml]`` writes it
(stdout without ``--out``); a test keeps ``deploy/prometheus/rules.yml`` equal to what the shipped rules give
and runs ``promtool test rules`` on it.

Prometheus sees groups, not devices: fleet-level series are per (fleet, bundle, target) (per (fleet, model,
bundle) for error ratios), so a Prometheus alert says "a device of this group breaches" with the worst device's
value, where the collector's own engine names each device. Kinds with no series to judge (``spool_disk_full``,
``rollout_failed``) are left out of the file, each with a comment saying so; the collector's engine covers them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

from edgekit.fleet.alerts.rules import (
    DEFAULT_RULES_PATH,
    AlertRules,
    DeviceStateRule,
    ErrorRateAboveRule,
    P99AboveFleetMedianRule,
    P99AboveRule,
    TemperatureAboveRule,
    load_alert_rules,
)

GROUP_NAME = "edgekit-fleet"
#: Kinds Prometheus cannot judge from the collector's fleet-level series, and why.
NOT_IN_PROMETHEUS = {
    "spool_disk_full": "no series carries the agents' spool state; the collector's alert engine judges it",
    "rollout_failed": "rollouts are records in the store, not series; the collector's alert engine judges them",
}


def _seconds(ms: float) -> str:
    return f"{ms / 1000.0:g}"


def _one_instance(series: str) -> str:
    """``series`` as one collector serves it: every collector of a group (``fleet collect --workers N``, one scrape
    target each) serves the same figures, read from the one store, so each rule fired N times without this."""
    return f"max without (instance) ({series})"


def _device_state(rule: DeviceStateRule) -> tuple[str, str]:
    """Every collector of a group (``fleet collect --workers N``, one scrape target each) serves the same counts, read
    from the one store: one instance's are taken (``max without (instance)``) before the states are summed."""
    states = "|".join(rule.states)
    return (f'sum by (fleet, bundle, target) (max without (instance) (edgekit_fleet_devices{{state=~"{states}"}})) > 0',
            f"{{{{ $value }}}} device(s) of fleet {{{{ $labels.fleet }}}} (bundle {{{{ $labels.bundle }}}}, target "
            f"{{{{ $labels.target }}}}) are {' or '.join(rule.states)}")  # fmt: skip


def _p99_above(rule: P99AboveRule) -> tuple[str, str]:
    worst = _one_instance('edgekit_fleet_latency_p99_seconds{stat="max"}')
    return (f"{worst} > {_seconds(rule.threshold_ms)}",
            f"a device of fleet {{{{ $labels.fleet }}}} on {{{{ $labels.bundle }}}} ({{{{ $labels.target }}}}) has p99 "
            f"{{{{ $value | humanizeDuration }}}} > {rule.threshold_ms:g} ms")  # fmt: skip


def _p99_above_fleet_median(rule: P99AboveFleetMedianRule) -> tuple[str, str]:
    worst = _one_instance('edgekit_fleet_latency_p99_seconds{stat="max"}')
    median = _one_instance('edgekit_fleet_latency_p99_seconds{stat="median"}')
    return (f"{worst} > ignoring(stat) {rule.factor:g} * {median}"
            f" and on(fleet, bundle, target) {worst} >= {_seconds(rule.min_p99_ms)}"
            f" and on(fleet, bundle, target) {_one_instance('edgekit_fleet_devices_reporting')} >= {rule.min_devices}",
            f"a device of fleet {{{{ $labels.fleet }}}} on {{{{ $labels.bundle }}}} ({{{{ $labels.target }}}}) has p99 "
            f"{{{{ $value | humanizeDuration }}}}, over {rule.factor:g} x the group's median")  # fmt: skip


def _error_rate_above(rule: ErrorRateAboveRule) -> tuple[str, str]:
    return (f"{_one_instance('edgekit_fleet_model_error_ratio')} > {rule.share:g}",
            f"model {{{{ $labels.model }}}} of bundle {{{{ $labels.bundle }}}} in fleet {{{{ $labels.fleet }}}} failed "
            f"{{{{ $value | humanizePercentage }}}} of its inferences (> {rule.share:.1%}) over 5 minutes")  # fmt: skip


def _temperature_above(rule: TemperatureAboveRule) -> tuple[str, str]:
    hottest = _one_instance('edgekit_fleet_temperature_max_celsius{stat="max"}')
    return (f"{hottest} > {rule.threshold_c:g}",
            f"a device of fleet {{{{ $labels.fleet }}}} on {{{{ $labels.bundle }}}} ({{{{ $labels.target }}}}) is at "
            f"{{{{ $value }}}} C > {rule.threshold_c:g} C")  # fmt: skip


#: Rule kind -> its PromQL expression and summary (kinds in NOT_IN_PROMETHEUS have none).
EXPRESSIONS: dict[str, Callable[[Any], tuple[str, str]]] = {
    "device_state": _device_state,
    "p99_above": _p99_above,
    "p99_above_fleet_median": _p99_above_fleet_median,
    "error_rate_above": _error_rate_above,
    "temperature_above": _temperature_above,
}


#: Characters a YAML reader would not take as they are inside a double-quoted scalar (not printable in YAML, or a
#: line break to YAML 1.1): written as escapes.
_YAML_ESCAPED = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff\ufeff\ufffe\uffff]")


def _quote(text: str) -> str:
    """``text`` as a double-quoted YAML scalar: JSON's string escapes (quotes, backslashes, newlines and other control
    characters), which YAML reads the same, plus ``\\uXXXX`` for what YAML does not take as it is."""
    return _YAML_ESCAPED.sub(lambda found: f"\\u{ord(found.group()):04x}", json.dumps(text, ensure_ascii=False))


def prometheus_rules_text(rules: AlertRules, source: str = "edgekit/fleet/alerts/default_rules.yaml") -> str:
    """The Prometheus rule file for ``rules`` (YAML text), read from ``source`` (named in its header)."""
    lines = [
        f"# Generated from {source} by `python -m edgekit.fleet.alerts.prometheus --out deploy/prometheus/rules.yml`;",
        "# edit the rules there and generate again (tests/fleet/alerts/test_prometheus_rules.py checks this file).",
        "# Series: deploy/prometheus/METRICS.md (fleet level, per fleet/bundle/target).",
        "groups:",
        f"  - name: {GROUP_NAME}",
        "    rules:",
    ]
    for name, rule in rules.rules.items():
        if rule.kind in NOT_IN_PROMETHEUS:
            lines.append(f"      # {name} ({rule.kind}): not here: {NOT_IN_PROMETHEUS[rule.kind]}")
            continue
        expr, summary = EXPRESSIONS[rule.kind](rule)
        lines += [f"      - alert: {name}", f"        expr: {_quote(expr)}"]
        if rule.for_s > 0:
            lines.append(f"        for: {rule.for_}")
        lines += ["        labels:", f"          severity: {rule.severity}", f"          edgekit_kind: {rule.kind}"]
        lines += [f"          {key}: {_quote(value)}" for key, value in sorted(rule.labels.items())]
        lines += ["        annotations:", f"          summary: {_quote(summary)}"]
        if rule.description:
            lines.append(f"          description: {_quote(rule.description)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgekit.fleet.alerts.prometheus",
                                     description="Write the alert rules as a Prometheus rule file.")  # fmt: skip
    parser.add_argument("--rules", type=Path, default=DEFAULT_RULES_PATH, help="alert rules file (default: the shipped one)")
    parser.add_argument("--out", type=Path, help="write here instead of stdout")
    args = parser.parse_args(argv)
    source = "edgekit/fleet/alerts/default_rules.yaml" if args.rules == DEFAULT_RULES_PATH else str(args.rules)
    text = prometheus_rules_text(load_alert_rules(args.rules), source)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


__all__ = ["EXPRESSIONS", "NOT_IN_PROMETHEUS", "prometheus_rules_text"]
