"""deploy/prometheus/rules.yml: generated from the shipped alert rules, on the series METRICS.md publishes, and
green under ``promtool check rules`` and ``promtool test rules`` (deploy/prometheus/rules_test.yml: each rule
pending on one bad sample, firing once its ``for:`` has passed, clearing)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from edgekit.fleet.alerts.prometheus import NOT_IN_PROMETHEUS, main, prometheus_rules_text
from edgekit.fleet.alerts.rules import load_alert_rules

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "prometheus"
RULES = DEPLOY / "rules.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)")


def test_rules_yml_is_generated_from_the_shipped_rules() -> None:
    assert RULES.read_text() == prometheus_rules_text(load_alert_rules()), (
        "deploy/prometheus/rules.yml is out of date: run python -m edgekit.fleet.alerts.prometheus --out "
        "deploy/prometheus/rules.yml")  # fmt: skip
    text = RULES.read_text()
    for name, rule in load_alert_rules().rules.items():
        if rule.kind in NOT_IN_PROMETHEUS:
            assert f"# {name} ({rule.kind}): not here: " in text
        else:
            assert f"- alert: {name}\n" in text
            assert f"        for: {rule.for_}\n" in text


def test_rules_use_only_series_that_metrics_md_publishes() -> None:
    published = set(re.findall(r"`(edgekit_[a-z0-9_]+)`", (DEPLOY / "METRICS.md").read_text()))
    used = set(re.findall(r"\b(edgekit_[a-z0-9_]+)\{?", "\n".join(line for line in RULES.read_text().splitlines()
                                                                   if line.strip().startswith("expr:"))))  # fmt: skip
    assert used and used <= published, f"not in METRICS.md: {sorted(used - published)}"


def test_the_generator_writes_a_file_of_ones_own(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("rules:\n  Hot:\n    kind: temperature_above\n    threshold_c: 70\n    for: 10m\n    severity: critical\n"
                    "    labels: {team: robots}\n")  # fmt: skip
    out = tmp_path / "rules.yml"
    assert main(["--rules", str(mine), "--out", str(out)]) == 0
    text = out.read_text()
    assert "- alert: Hot\n" in text and "for: 10m" in text and 'team: "robots"' in text
    assert 'expr: "max without (instance) (edgekit_fleet_temperature_max_celsius{stat=\\"max\\"}) > 70"' in text
    if PROMTOOL:
        checked = subprocess.run([PROMTOOL, "check", "rules", str(out)], capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0, checked.stdout + checked.stderr


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    checked = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 6 rules found" in checked.stdout


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    tested = subprocess.run([PROMTOOL, "test", "rules", "rules_test.yml"], cwd=DEPLOY, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout
