"""The --store URL's password never leaves the collector: not in a /metrics answer, a log line, or what
``fleet collect`` prints (console and --json). The test server trusts local connections, so a made-up
password still connects."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from edgekit.fleet.metrics import IngestMetrics, MetricsServer
from edgekit.fleet.metrics_fleet import FleetReader
from edgekit.fleet.store import open_store
from tests.fleet.alerts.live_messages import live_window
from tests.runtime.agent.mosquitto import MosquittoBroker

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "S3cretPassw0rd"


def _with_password(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{PASSWORD}@{parts.hostname}:{parts.port}"))


@pytest.fixture
def secret_url(postgres_url: str) -> str:
    url = _with_password(postgres_url)
    with open_store(url) as store:
        store.add_windows([live_window(1, window_s=60)])
    return url


def test_an_unknown_fleet_answer_shows_the_store_without_its_password(secret_url: str) -> None:
    store = open_store(secret_url)
    server = MetricsServer(IngestMetrics(), 0, store=store).start()
    try:
        with pytest.raises(urllib.error.HTTPError, match="404") as unknown:
            urllib.request.urlopen(server.url + "/devices?fleet=typo", timeout=10)
        body = unknown.value.read().decode()
    finally:
        server.stop()
        store.close()
    assert PASSWORD not in body
    assert f"no device of fleet 'typo' ever reported to the store {_shown(secret_url)}; known fleets: lab" in body, body


def test_a_failed_store_read_logs_the_store_without_its_password(secret_url: str, caplog: pytest.LogCaptureFixture) -> None:
    store = open_store(secret_url)
    reader = FleetReader(store, background=False)
    store.close()
    with caplog.at_level(logging.WARNING, logger="edgekit.fleet.metrics_fleet"):
        assert reader.snapshot() is None
    assert reader.read_errors == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"metrics: cannot read the fleet store {_shown(secret_url)}: fleet store {_shown(secret_url)} is closed\n"
        "  hint: open it again with open_store(url)"]


def _shown(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{parts.hostname}:{parts.port}"))


def test_fleet_collect_prints_the_store_without_its_password(secret_url: str, tmp_path: Path) -> None:
    broker = MosquittoBroker(tmp_path / "mosquitto").start()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "edgekit.cli.main", "fleet", "collect", "--broker", broker.url, "--store", secret_url,
             "--fleet", "lab", "--no-metrics", "--duration", "1", "--session-expiry", "0", "--json"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        broker.stop()
    assert result.returncode == 0, result.stderr
    assert PASSWORD not in result.stdout + result.stderr
    started = json.loads(result.stdout.splitlines()[0])
    assert started["event"] == "started" and started["store"] == _shown(secret_url)
    assert f"into {_shown(secret_url)} as" in result.stderr.replace("\n", "")


@pytest.mark.parametrize("output", ["--json", "console"])
def test_fleet_simulate_history_prints_the_store_without_its_password(secret_url: str, output: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "edgekit.cli.main", "fleet", "simulate", "--history", "1m", "--devices", "1", "--window-s", "30",
         "--store", secret_url, *([output] if output == "--json" else [])],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert PASSWORD not in result.stdout + result.stderr  # before: in the "seeding ... into" line and the JSON
    if output == "--json":
        assert json.loads(result.stdout)["store"] == _shown(secret_url)
    else:
        assert _shown(secret_url) in (result.stdout + result.stderr).replace("\n", "")


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://u:pw@[::1]:5432/db", "postgresql://u:***@[::1]:5432/db"),  # the IPv6 address keeps its brackets
    ("postgresql://u@h/db?password=pw&sslmode=prefer", "postgresql://u@h/db?password=***&sslmode=prefer"),
    ("postgresql://u@h1:5432,h2:5433/db?sslpassword=k&passfile=/home/u/.pgpass&PASSWORD=x",
     "postgresql://u@h1:5432,h2:5433/db?sslpassword=***&passfile=***&PASSWORD=***"),
    ("postgresql://u:pw@h/db?options=-csearch_path%3Ds", "postgresql://u:***@h/db?options=-csearch_path%3Ds"),
    ("sqlite:///tmp/fleet.db", "sqlite:///tmp/fleet.db"),
])  # fmt: skip
def test_redact_masks_every_password_libpq_reads_and_keeps_the_host(url: str, shown: str) -> None:
    from edgekit.fleet.store.urls import redact

    assert redact(url) == shown


def test_the_dashboard_shows_a_store_whose_password_is_a_query_parameter_without_it(postgres_url: str) -> None:
    from edgekit.fleet.dashboard import DashboardServer

    url = f"{postgres_url}&password={PASSWORD}&sslmode=prefer"  # libpq reads ?password= too; the local server trusts us
    with open_store(url) as store:
        store.add_windows([live_window(1, window_s=60)])
    with DashboardServer(url, port=0, cache_s=0.0) as server:
        overview = json.loads(urllib.request.urlopen(server.url + "api/overview", timeout=10).read())
        with pytest.raises(urllib.error.HTTPError, match="404") as unknown:
            urllib.request.urlopen(server.url + "api/overview?fleet=typo", timeout=10)
        body = unknown.value.read().decode()
    assert overview["store"] == url.replace(PASSWORD, "***") and PASSWORD not in body and "password=***" in body, body
