"""The generated Prometheus rule file holds any description and label value as written (newlines, a '---' line,
quotes, backslashes, characters YAML would not take raw), and its device counts are right with ``fleet collect
--workers N``, where every worker serves the same counts from the one store."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from edgekit.fleet.alerts.prometheus import prometheus_rules_text
from edgekit.fleet.alerts.rules import AlertRules

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)")
AWKWARD = "Slow.\n---\nSee 'the runbook': \"C:\\edge\\run.md\"\u2028next\x85line\x7f, 95 \u00b0C \U0001F525\n"


def test_descriptions_and_labels_come_back_as_written(tmp_path: Path) -> None:
    rules = AlertRules.model_validate({"rules": {"slow": {"kind": "p99_above", "threshold_ms": 50, "description": AWKWARD,
                                                          "labels": {"team": "vision\n---", "runbook": "a'b\"c"}}}})  # fmt: skip
    text = prometheus_rules_text(rules)
    [rule] = yaml.safe_load(text)["groups"][0]["rules"]
    assert rule["annotations"]["description"] == AWKWARD
    assert rule["labels"] == {"severity": "warning", "edgekit_kind": "p99_above", "team": "vision\n---", "runbook": "a'b\"c"}
    assert rule["expr"] == 'max without (instance) (edgekit_fleet_latency_p99_seconds{stat="max"}) > 0.05'
    if PROMTOOL:
        (tmp_path / "rules.yml").write_text(text, encoding="utf-8")
        checked = subprocess.run([PROMTOOL, "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0 and "SUCCESS: 1 rules found" in checked.stdout, checked.stdout + checked.stderr


WORKERS_TEST = """rule_files: [rules.yml]
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:  # two workers (two scrape targets) serving the same counts, read from one store
      - series: 'edgekit_fleet_devices{job="edgekit-collector",instance="w0:9108",fleet="lab",bundle="b1",target="orin",state="offline"}'
        values: '2x10'
      - series: 'edgekit_fleet_devices{job="edgekit-collector",instance="w1:9109",fleet="lab",bundle="b1",target="orin",state="offline"}'
        values: '2x10'
      - series: 'edgekit_fleet_devices{job="edgekit-collector",instance="w0:9108",fleet="lab",bundle="b1",target="orin",state="stale"}'
        values: '1x10'
      - series: 'edgekit_fleet_devices{job="edgekit-collector",instance="w1:9109",fleet="lab",bundle="b1",target="orin",state="stale"}'
        values: '1x10'
    alert_rule_test:
      - eval_time: 1m
        alertname: gone
        exp_alerts:
          - exp_labels: {severity: warning, edgekit_kind: device_state, fleet: lab, bundle: b1, target: orin}
            exp_annotations:
              summary: '3 device(s) of fleet lab (bundle b1, target orin) are stale or offline'
"""


@needs_promtool
def test_device_counts_are_not_multiplied_by_the_workers(tmp_path: Path) -> None:
    rules = AlertRules.model_validate({"rules": {"gone": {"kind": "device_state", "states": ["stale", "offline"]}}})
    (tmp_path / "rules.yml").write_text(prometheus_rules_text(rules), encoding="utf-8")
    (tmp_path / "rules_test.yml").write_text(WORKERS_TEST, encoding="utf-8")
    tested = subprocess.run([str(PROMTOOL), "test", "rules", "rules_test.yml"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


P99_WORKERS_TEST = """rule_files: [rules.yml]
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:  # two workers serving the same worst p99 and temperature: one alert each, not one per worker
      - series: 'edgekit_fleet_latency_p99_seconds{job="edgekit-collector",instance="w0:9108",fleet="lab",bundle="b1",target="orin",stat="max"}'
        values: '0.2x10'
      - series: 'edgekit_fleet_latency_p99_seconds{job="edgekit-collector",instance="w1:9109",fleet="lab",bundle="b1",target="orin",stat="max"}'
        values: '0.2x10'
      - series: 'edgekit_fleet_temperature_max_celsius{job="edgekit-collector",instance="w0:9108",fleet="lab",bundle="b1",target="orin",stat="max"}'
        values: '90x10'
      - series: 'edgekit_fleet_temperature_max_celsius{job="edgekit-collector",instance="w1:9109",fleet="lab",bundle="b1",target="orin",stat="max"}'
        values: '90x10'
    alert_rule_test:
      - eval_time: 1m
        alertname: slow
        exp_alerts:
          - exp_labels: {severity: warning, edgekit_kind: p99_above, job: edgekit-collector, fleet: lab, bundle: b1, target: orin, stat: max}
            exp_annotations:
              summary: 'a device of fleet lab on b1 (orin) has p99 200ms > 100 ms'
      - eval_time: 1m
        alertname: hot
        exp_alerts:
          - exp_labels: {severity: warning, edgekit_kind: temperature_above, job: edgekit-collector, fleet: lab, bundle: b1, target: orin, stat: max}
            exp_annotations:
              summary: 'a device of fleet lab on b1 (orin) is at 90 C > 85 C'
"""


@needs_promtool
def test_worst_device_rules_fire_once_whatever_the_workers(tmp_path: Path) -> None:
    rules = AlertRules.model_validate({"rules": {"slow": {"kind": "p99_above", "threshold_ms": 100},
                                                 "hot": {"kind": "temperature_above", "threshold_c": 85}}})  # fmt: skip
    (tmp_path / "rules.yml").write_text(prometheus_rules_text(rules), encoding="utf-8")
    (tmp_path / "rules_test.yml").write_text(P99_WORKERS_TEST, encoding="utf-8")
    tested = subprocess.run([str(PROMTOOL), "test", "rules", "rules_test.yml"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr  # before: two alerts each, one per worker
