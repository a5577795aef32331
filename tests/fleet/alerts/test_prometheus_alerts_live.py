"""One rules file, two judges: a running ``edgekit fleet collect --alert-rules FILE`` (its own engine, over MQTT)
and a real Prometheus (Debian's package) loaded with the rule file generated from the same FILE, scraping that
collector every second. A device's last will and a slow device fire both, after their ``for:``, and both clear."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from edgekit.fleet.alerts.prometheus import prometheus_rules_text
from edgekit.fleet.alerts.rules import load_alert_rules
from edgekit_runtime.agent.telemetry import encode_message
from tests.fleet.alerts.live_messages import AlertListener, live_telemetry
from tests.fleet.messages import Publisher, status, topic
from tests.runtime.agent.mosquitto import MosquittoBroker, free_port

REPO = Path(__file__).resolve().parents[3]
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
FLEET = "promalerts"
RULES = f"""schema_version: 1
evaluate_every: 250ms
rules:
  device-offline:
    kind: device_state
    states: [offline]
    for: 2s
    severity: critical
  p99-slow:
    kind: p99_above
    threshold_ms: 50
    for: 2s
"""


def _get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, ConnectionError, ValueError):
        return None


def _wait(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout_s:g} s")


def test_the_collector_and_prometheus_fire_and_clear_the_same_rules(fleet_broker: MosquittoBroker, tmp_path: Path) -> None:
    if not Path(PROMETHEUS).is_file():
        pytest.skip("prometheus is not installed (Debian: apt-get install prometheus)")
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(RULES)
    (tmp_path / "rules.yml").write_text(prometheus_rules_text(load_alert_rules(rules_file), str(rules_file)))
    listener = AlertListener(fleet_broker, FLEET)
    collect = subprocess.Popen(
        [sys.executable, "-m", "edgekit.cli.main", "fleet", "collect", "--broker", fleet_broker.url, "--store",
         f"sqlite:///{tmp_path / 'fleet.db'}", "--fleet", FLEET, "--metrics-port", "0", "--metrics-cache-seconds", "0.5",
         "--session-expiry", "0", "--json", "--alert-rules", str(rules_file)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    prometheus = None
    try:
        assert collect.stdout is not None
        started = json.loads(collect.stdout.readline() or "{}")
        assert started.get("event") == "started", collect.stderr.read() if collect.stderr else ""
        config = yaml.safe_load((REPO / "deploy" / "prometheus" / "scrape.yml").read_text())
        config["global"].update(scrape_interval="1s", evaluation_interval="1s")
        config["rule_files"] = [str(tmp_path / "rules.yml")]
        (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "edgekit-collector"]
        job.update(scrape_interval="1s", scrape_timeout="1s",
                   static_configs=[{"targets": [urllib.parse.urlsplit(started["metrics_url"]).netloc]}])  # fmt: skip
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        with (tmp_path / "prometheus.log").open("w") as log:
            prometheus = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                                          f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                                         stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        api = f"http://127.0.0.1:{port}/api/v1"
        _wait(lambda: (_get_json(f"{api}/rules") or {}).get("status") == "success", 30, "Prometheus with the rules loaded")

        def prometheus_alerts(state: str) -> set[tuple[str, str]]:
            found = (_get_json(f"{api}/alerts") or {}).get("data", {}).get("alerts", [])
            return {(a["labels"]["alertname"], a["labels"].get("fleet", "")) for a in found if a["state"] == state}

        with Publisher(fleet_broker) as agents:
            for device in ("cam-1", "cam-2"):
                agents.publish(topic("status", device, FLEET), status("online", device=device, fleet=FLEET), retain=True)
                agents.publish(topic("telemetry", device, FLEET),  # 10 s windows: online for 30 s without another
                               encode_message(live_telemetry(1, device=device, fleet=FLEET, window_s=10.0,
                                                             p99_ms=250.0 if device == "cam-1" else 5.0)))  # fmt: skip
            agents.publish(topic("status", "cam-2", FLEET), status("offline", device="cam-2", fleet=FLEET), retain=True)
            breached_at = time.monotonic()

            both = {("device-offline", FLEET), ("p99-slow", FLEET)}
            _wait(lambda: prometheus_alerts("firing") == both, 30, "both alerts firing in Prometheus")
            _wait(lambda: {(m["rule"], m["device"]) for m in listener.messages("firing")} == {("device-offline", "cam-2"),
                                                                                              ("p99-slow", "cam-1")},
                  10, "both alerts firing from the collector's engine over MQTT")  # fmt: skip
            assert min(t for t, _ in listener.mqtt) - breached_at >= 2.0  # for: 2s

            agents.publish(topic("status", "cam-2", FLEET), status("online", device="cam-2", fleet=FLEET), retain=True)
            agents.publish(topic("telemetry", "cam-2", FLEET), encode_message(live_telemetry(2, device="cam-2", fleet=FLEET, window_s=10.0)))
            agents.publish(topic("telemetry", "cam-1", FLEET), encode_message(live_telemetry(2, device="cam-1", fleet=FLEET, window_s=10.0)))
            _wait(lambda: not prometheus_alerts("firing") and not prometheus_alerts("pending"), 30, "Prometheus' alerts to clear")
            _wait(lambda: len(listener.messages("resolved")) == 2, 10, "both engine alerts resolved over MQTT")
    finally:
        listener.close()
        for process in (prometheus, collect):
            if process is not None:
                process.terminate()
                try:
                    process.communicate(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.communicate()
