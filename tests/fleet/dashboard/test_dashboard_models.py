"""The dashboard per model (issue 20), in a real headless Chromium: a store holding the windows of two agents serving
two models (through the collector's parser) and of one naming none; the device table's models column and filter,
the fleet charts grouped by model (latency, and each model's throughput instead of the shared power), and the API."""

from __future__ import annotations

import datetime as dt
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from edgekit_runtime.agent.telemetry import encode_message

from edgekit.fleet.dashboard import DashboardServer
from edgekit.fleet.dashboard.browser import HeadlessChromium, chromium_missing
from edgekit.fleet.ingest import parse_message
from edgekit.fleet.store import TelemetryWindow, open_store
from tests.fleet.dashboard.test_dashboard_browser import _plotted, _settled, _values, _wait
from tests.fleet.messages import telemetry
from tests.fleet.model_messages import model_entry, model_telemetry


def _parsed(message: dict[str, Any]) -> TelemetryWindow:
    record = parse_message(f"edgekit/v1/{message['fleet']}/{message['device']}/telemetry", encode_message(message),
                           received_at=dt.datetime.fromisoformat(message["window"]["end"]))  # fmt: skip
    assert isinstance(record, TelemetryWindow)
    return record


@pytest.fixture(scope="module")
def models_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    store_url = f"sqlite:///{tmp_path_factory.mktemp('models-dashboard')}/fleet.db"
    start = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(minutes=30)
    windows = []
    for device in ("cam-1", "cam-2"):
        for seq in range(1, 121):  # 20 minutes of 10 s windows
            entries = [model_entry("detector", "yolo-int8-1", [9.0, 10.0, 11.0, 12.0]), model_entry("classifier", "mobilenet-2", [2.0] * 2)]
            windows.append(_parsed(model_telemetry(seq, entries, device=device, start=start + dt.timedelta(seconds=10 * seq))))
    windows += [_parsed(telemetry(seq, device="old-1", start=start + dt.timedelta(seconds=10 * seq))) for seq in range(1, 121)]
    with open_store(store_url) as store:
        store.add_windows(windows)
    with DashboardServer(store_url, port=0, cache_s=0.0) as server:
        yield server.url.rstrip("/")


def test_api_lists_models_and_groups_series_by_model(models_dashboard: str) -> None:
    with urllib.request.urlopen(models_dashboard + "/api/devices", timeout=10) as response:
        table = json.load(response)
    devices = {d["device"]: d for d in table["devices"]}
    assert (devices["cam-1"]["models"], devices["old-1"]["models"]) == ("classifier, detector", None)
    assert table["columns"]["models"] is True
    with urllib.request.urlopen(models_dashboard + "/api/devices?q=CLASSIF", timeout=10) as response:
        assert sorted(d["device"] for d in json.load(response)["devices"]) == ["cam-1", "cam-2"]  # a model's name is searched
    with urllib.request.urlopen(models_dashboard + "/api/fleet-series?by=model&hours=1", timeout=10) as response:
        series = json.load(response)
    assert series["by"] == "model" and set(series["groups"]) == {"classifier", "detector", "(none)"}
    detector = series["groups"]["detector"]
    assert detector["devices"] == 2 and all(v == pytest.approx(0.4) for v in detector["throughput_per_s"] if v is not None)


@pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))
def test_page_shows_models_and_groups_the_fleet_by_model(models_dashboard: str, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    with HeadlessChromium() as browser:
        browser.load(models_dashboard + "#range=1")
        driver = browser.driver
        assert driver.execute_script("return document.body.dataset.error || null") is None
        assert driver.find_element(By.CSS_SELECTOR, "#devices th.models").is_displayed()
        row = driver.find_element(By.CSS_SELECTOR, "#devices tr[data-device='cam-2']")
        assert row.find_elements(By.TAG_NAME, "td")[4].text == "classifier, detector"
        driver.find_element(By.ID, "filter").send_keys("classifier")
        _settled(driver)
        shown = sorted(r.get_attribute("data-device") for r in driver.find_elements(By.CSS_SELECTOR, "#devices tbody tr"))
        assert shown == ["cam-1", "cam-2"]

        Select(driver.find_element(By.ID, "group-by")).select_by_value("model")
        _wait(driver, "return document.querySelector('#chart-bundles figcaption').textContent.includes('by model')")
        _settled(driver)
        latency = _plotted(driver, "chart-bundles")
        assert set(latency["series"]) == {"classifier", "detector", "(none)"}
        assert max(_values(latency, "classifier")) < min(_values(latency, "detector"))  # 2 ms against 9-12 ms
        assert "throughput per device by model" in driver.find_element(By.CSS_SELECTOR, "#chart-fleet-power figcaption").text
        throughput = _plotted(driver, "chart-fleet-power")
        assert _values(throughput, "detector") and all(v == pytest.approx(0.4) for v in _values(throughput, "detector"))
        assert "by=model" in driver.current_url
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
