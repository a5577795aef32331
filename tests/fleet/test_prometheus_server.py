"""The shipped scrape config (deploy/prometheus/scrape.yml) against real Prometheus tools: `promtool check config`,
and a real Prometheus server (Debian's `prometheus` package) scraping a running `edgekit fleet collect` every
second, whose HTTP API then returns the fleet-level series the collector serves (issue 27 items 5 and 6)."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from edgekit_runtime.agent.telemetry import encode_message

from tests.fleet.messages import BUNDLE_A, Publisher, status, telemetry, topic
from tests.runtime.agent.mosquitto import MosquittoBroker, free_port

REPO = Path(__file__).resolve().parents[2]
SCRAPE_CONFIG = REPO / "deploy" / "prometheus" / "scrape.yml"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def _require(binary: str) -> str:
    if not Path(binary).is_file():
        pytest.skip(f"{Path(binary).name} is not installed (apt-get install prometheus)")
    return binary


def test_the_shipped_scrape_config_passes_promtool() -> None:
    result = subprocess.run([_require(PROMTOOL), "check", "config", str(SCRAPE_CONFIG)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A running `edgekit fleet collect` (its own process, a real Mosquitto, a SQLite store)."""
    broker = MosquittoBroker(tmp_path / "mosquitto").start()
    process = subprocess.Popen(
        [sys.executable, "-m", "edgekit.cli.main", "fleet", "collect", "--broker", broker.url, "--store",
         f"sqlite:///{tmp_path / 'fleet.db'}", "--fleet", "prom", "--metrics-port", "0", "--metrics-cache-seconds", "0.5",
         "--json"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        started = json.loads(process.stdout.readline() or "{}")
        assert started.get("event") == "started", process.stderr.read() if process.stderr else ""
        yield {"broker": broker, "metrics_url": started["metrics_url"]}
    finally:
        process.terminate()
        try:
            process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
        broker.stop()


@pytest.fixture
def prometheus(tmp_path: Path, collector: dict[str, Any]) -> Iterator[str]:
    """A real Prometheus on a free loopback port, scraping the collector every second with the shipped config."""
    binary = _require(PROMETHEUS)
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    target = urllib.parse.urlsplit(collector["metrics_url"]).netloc
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "edgekit-collector"]
    job.update(scrape_interval="1s", scrape_timeout="1s", static_configs=[{"targets": [target]}])
    config_path = tmp_path / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen([binary, f"--config.file={config_path}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: _get(f"{url}/-/ready") is not None, 30, "Prometheus ready", tmp_path / "prometheus.log")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode("utf-8")
    except (urllib.error.URLError, ConnectionError):
        return None


def _wait(check: Any, timeout_s: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.25)
    raise AssertionError(f"no {what} within {timeout_s} s" + (f"; Prometheus said:\n{log.read_text()[-3000:]}" if log else ""))


def _query(prometheus: str, promql: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Instant query: {labels without __name__, job, instance: value}."""
    text = _get(f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    if text is None:
        return {}
    answer = json.loads(text)
    assert answer["status"] == "success", answer
    return {tuple(sorted((k, v) for k, v in r["metric"].items() if k not in ("__name__", "job", "instance"))): float(r["value"][1])
            for r in answer["data"]["result"]}  # fmt: skip


def test_a_real_prometheus_scrapes_a_running_collector(collector: dict[str, Any], prometheus: str) -> None:
    start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=10)
    with Publisher(collector["broker"]) as device:
        for name in ("cam-1", "cam-2", "cam-3", "cam-4"):
            device.publish(topic("status", device=name, fleet="prom"),
                           status("offline" if name == "cam-4" else "online", device=name, fleet="prom", bundle=BUNDLE_A))  # fmt: skip
            device.publish(topic("telemetry", device=name, fleet="prom"),
                           encode_message(telemetry(1, device=name, fleet="prom", start=start,
                                                    latencies_ms=[float(name[-1])] * 20)))  # fmt: skip
    online = f'edgekit_fleet_devices{{fleet="prom",bundle="{BUNDLE_A.id}",state="online"}}'
    _wait(lambda: list(_query(prometheus, online).values()) == [3.0], 30, "3 online devices in Prometheus")
    states = {dict(labels)["state"]: value for labels, value in _query(prometheus, 'edgekit_fleet_devices{fleet="prom"}').items()}
    assert states == {"online": 3.0, "stale": 0.0, "offline": 1.0, "unknown": 0.0}
    p50 = {dict(labels)["stat"]: value for labels, value in _query(prometheus, "edgekit_fleet_latency_p50_seconds").items()}
    assert p50 == pytest.approx({"median": 0.002, "max": 0.003})  # cam-4 is offline: left out
    assert list(_query(prometheus, 'edgekit_collector_records_stored_total{kind="telemetry"}').values()) == [4.0]
    assert list(_query(prometheus, 'up{job="edgekit-collector"}').values()) == [1.0]
    assert _query(prometheus, "edgekit_device_latency_p50_seconds") == {}  # per-device series are opt-in
