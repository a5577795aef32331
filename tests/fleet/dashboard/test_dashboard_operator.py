"""The operator's day on the dashboard (issue 32), in a real headless Chromium at 1,280 and 1,920 px: the rollout
row in progress (wave x/y, devices per outcome, the gate so far, elapsed and remaining time), rollout markers that
stay readable with six rollouts in 15 minutes, the newest (filling) bucket left out and said so, "idle" for an
online device without inferences, "no power sensor", the device table without sideways scrolling when devices
report models, the device page (identity, its own events filterable, its rollouts), a link to a device that does
not exist, dark mode, and "1 device"."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgekit.fleet.dashboard import DashboardServer
from edgekit.fleet.dashboard.browser import chromium_missing
from tests.fleet.dashboard.operator_store import CAMERAS, IDLE, MINUTES, NO_POWER, add_fresh_windows, seed_operator_store
from tests.fleet.dashboard.test_dashboard_browser import OVERFLOW, _plotted, _settled, _wait, browser, screenshot_dir  # noqa: F401

pytestmark = pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))

#: Every rollout label of a chart: text, the number of rollouts it stands for, its tooltip and its box.
LABELS = """return [...document.querySelectorAll('#' + arguments[0] + ' .marker-label')].map((l) => {
  const r = l.getBoundingClientRect(), plot = l.closest('.uplot').getBoundingClientRect();
  return {text: l.textContent, rollouts: Number(l.dataset.rollouts), title: l.title, left: r.left, right: r.right,
          inside: r.left >= plot.left - 1 && r.right <= plot.right + 1};
});"""


@pytest.fixture(scope="module")
def operator_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(store URL, dashboard URL)."""
    url = seed_operator_store(str(tmp_path_factory.mktemp("operator") / "fleet.db"))
    with DashboardServer(url, port=0, cache_s=0.0) as server:
        yield url, server.url.rstrip("/")


@pytest.fixture()
def operator_dashboard(operator_store: tuple[str, str]) -> str:
    return operator_store[1]


def _open(browser: Any, url: str, width: int, hash_: str) -> Any:
    driver = browser.driver
    driver.set_window_size(width, 1400)
    browser.load(f"{url}/#{hash_}")
    _settled(driver)
    _wait(driver, "return !!document.querySelector('#chart-bundles .marker-label')")
    return driver


@pytest.mark.parametrize("width", [1280, 1920])
def test_rollout_row_markers_and_layout(operator_store, browser, screenshot_dir, width: int) -> None:  # noqa: F811
    store_url, operator_dashboard = operator_store
    add_fresh_windows(store_url, MINUTES * 6 + (1 if width == 1280 else 2))  # the page then loads inside the newest bucket
    driver = _open(browser, operator_dashboard, width, f"range=0.25&device=lab/{CAMERAS[0]}")
    page_width, window_width = driver.execute_script(OVERFLOW)
    assert page_width <= window_width, f"page is {page_width} px wide in a {window_width} px window"
    table, box = driver.execute_script("const t = document.getElementById('devices'); return [t.scrollWidth, t.parentElement.clientWidth]")
    assert table <= box, f"the device table is {table} px in a {box} px box: it scrolls sideways"
    assert driver.execute_script("return getComputedStyle(document.querySelector('#devices .models')).display") != "none"
    assert driver.execute_script("return [...document.querySelectorAll('#devices th')].map((th) => th.offsetWidth > 0).every(Boolean)")
    for table in ("rollouts", "device-rollouts", "device-events"):  # no table of the page scrolls sideways either
        inner, outer = driver.execute_script(f"const t = document.getElementById('{table}'); return [t.scrollWidth, t.parentElement.clientWidth]")
        assert inner <= outer, f"#{table} is {inner} px in a {outer} px box"

    # the rollout in progress: its wave, devices per outcome, the gate so far, elapsed and what the gate has left
    row = driver.find_element("css selector", "#rollouts tr[data-rollout='r6']")
    text = row.text
    assert "watching" in text and "wave 2/3" in text and "dropped: 60%" in text, text
    assert "3 devices: 2 succeeded, 1 pending" in text, text
    assert "error rate 0.4% (limit 2.0%)" in text and "11.90 → 12.60 ms (1.06×, limit 1.50×) so far" in text, text
    assert "1 device of 2 heard from" in text, text
    elapsed = re.search(r"(\d+) min (\d\d) s, gate (\d+) min \d\d s left", text)
    assert elapsed and 100 <= 60 * int(elapsed[1]) + int(elapsed[2]) < 400 and 5 <= int(elapsed[3]) <= 9, text  # started 100 s before
    row.find_element("css selector", "summary").click()
    outcomes = {li.get_attribute("data-device"): li.get_attribute("data-outcome") for li in row.find_elements("css selector", "li")}
    assert outcomes == {CAMERAS[2]: "pending"}  # the summary lists the devices that did not succeed
    link = row.find_element("css selector", ".more-devices a").get_attribute("href")
    assert link.endswith("/api/rollout?id=r6"), link  # every device's outcome is one request away

    # six rollouts in 15 minutes: every one is in a label, labels never overlap and stay inside the chart
    for chart in ("chart-bundles", "chart-latency"):
        labels = driver.execute_script(LABELS, chart)
        assert sum(label["rollouts"] for label in labels) == 6, labels
        assert all(label["inside"] for label in labels), labels
        boxes = sorted((label["left"], label["right"]) for label in labels)
        assert all(right <= next_left + 0.5 for (_, right), (next_left, _) in zip(boxes, boxes[1:])), boxes
        merged = [label for label in labels if label["rollouts"] > 1]
        assert merged and all(label["text"].strip("▾ ").startswith(f"{label['rollouts']} rollouts") for label in merged)
        assert all(label["title"].count("rollout ") == label["rollouts"] for label in labels)  # each listed in the tooltip
    assert driver.find_element("id", "chart-bundles").get_attribute("data-markers") == "6"

    # the newest bucket is still filling: not drawn, and the resolution says so
    for chart in ("chart-bundles", "chart-fleet-power", "chart-latency"):
        filling = driver.find_element("id", chart).get_attribute("data-filling")
        assert filling is not None, chart
        plotted = _plotted(driver, chart)
        assert plotted["x"][-1] == float(filling) * 1000 and all(values[-1] is None for values in plotted["series"].values())
        assert all(any(v is not None for v in values) for values in plotted["series"].values())
    assert "is still filling and not drawn" in driver.find_element("id", "fleet-resolution").text
    assert "is still filling and not drawn" in driver.find_element("id", "resolution").text

    # an online device whose newest window had no inference is idle, not "–"
    idle = driver.find_element("css selector", f"#devices tr[data-device='{IDLE}']")
    assert [td.text for td in idle.find_elements("css selector", "td.idle")] == ["idle", "idle"]
    assert driver.find_element("css selector", ".card[data-card='bundles']").text.split() == ["2", "bundles"]
    driver.set_window_size(width, driver.execute_script("return document.documentElement.scrollHeight") + 20)
    driver.save_screenshot(str(screenshot_dir / f"operator-{width}.png"))


def test_device_page_shows_identity_its_events_and_rollouts(operator_dashboard, browser) -> None:  # noqa: F811
    from selenium.webdriver.support.ui import Select

    driver = _open(browser, operator_dashboard, 1280, f"range=0.25&device=lab/{CAMERAS[0]}")
    identity = {div.get_attribute("data-field"): div.find_element("tag name", "dd").text
                for div in driver.find_elements("css selector", "#device-identity div[data-field]")}  # fmt: skip
    assert identity["board"] == "NVIDIA Jetson Orin Nano 8GB Developer Kit" and identity["os"] == "Ubuntu 22.04.4 LTS"
    assert identity["jetpack"] == "6.1" and identity["power_mode"] == "15W" and identity["l4t"] == "36.4.0"
    events = driver.find_elements("css selector", "#device-events tbody tr")
    assert len(events) == 4 and "another camera's event" not in driver.find_element("id", "device-events").text
    Select(driver.find_element("id", "device-event-level")).select_by_value("error")
    rows = driver.find_elements("css selector", "#device-events tbody tr")
    assert [r.get_attribute("data-kind") for r in rows] == ["self_check_failed"]
    assert driver.find_element("id", "device-event-count").text == "1 of 4 events"
    Select(driver.find_element("id", "device-event-level")).select_by_value("")
    Select(driver.find_element("id", "device-event-kind")).select_by_value("bundle_installed")
    assert len(driver.find_elements("css selector", "#device-events tbody tr")) == 2
    driver.find_element("id", "device-event-filter").send_keys("v4")
    assert [r.text for r in driver.find_elements("css selector", "#device-events tbody tr td.wrap")] == ["installed digits-cnn-v4"]
    history = driver.find_elements("css selector", "#device-rollouts tbody tr")
    assert [r.get_attribute("data-rollout") for r in history] == ["r6", "r5", "r4", "r3", "r2", "r1"]
    assert "succeeded (wave" not in history[1].text and "digits-cnn" in history[0].text
    assert re.search(r"p99 \d+\.\d\d → \d+\.\d\d ms, \d+\.\d\d → \d+\.\d\d W", history[-1].find_element("css selector", "td.compare").text)

    # the view exported: the lines shown as CSV (full names, units, local times), the plot as PNG
    csv_text = driver.execute_script("return chartCsv('chart-latency')")
    lines = csv_text.strip().split("\n")
    assert lines[0] == "time,p50 (ms),p99 (worst window) (ms)"
    assert len(lines) - 1 == len(_plotted(driver, "chart-latency")["x"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,[\d.]+,[\d.]+", lines[1]), lines[1]
    assert driver.execute_script("return chartPng('chart-latency')").startswith("data:image/png;base64,")
    assert [b.text for b in driver.find_elements("css selector", "#chart-latency .chart-export button")] == ["CSV", "PNG"]

    # a device without a power sensor: its power chart says so, not "no telemetry"
    driver.find_element("css selector", f"#devices tr[data-device='{NO_POWER}']").click()
    _wait(driver, f"const e = document.querySelector('#chart-power .chart-empty'); return !!e && e.textContent.includes('{NO_POWER}')")
    assert driver.find_element("css selector", "#chart-power .chart-empty").text == (
        f"no power sensor on {NO_POWER}: its telemetry carries no power readings")
    assert int(driver.find_element("id", "chart-latency").get_attribute("data-points")) > 0
    assert "its agent reports no identity" in driver.find_element("id", "device-identity").text


def test_a_link_to_a_missing_device_says_so(operator_dashboard, browser) -> None:  # noqa: F811
    driver = browser.driver
    driver.set_window_size(1280, 1000)
    browser.load(f"{operator_dashboard}/#range=1&device=lab/cam-nowhere-99")
    _settled(driver)
    _wait(driver, "return !document.getElementById('device-missing').hidden")
    notice = driver.find_element("id", "device-missing").text
    assert notice.startswith("No device cam-nowhere-99 in fleet lab in this store")
    assert not driver.find_element("id", "device-body").is_displayed()
    assert driver.find_elements("css selector", "#devices tr.selected") == []  # no other device shown in its place
    assert "device=lab%2Fcam-nowhere-99" in driver.current_url or "device=lab/cam-nowhere-99" in driver.current_url
    driver.find_element("css selector", f"#devices tr[data-device='{CAMERAS[2]}']").click()
    _wait(driver, "return document.getElementById('device-missing').hidden")
    assert driver.find_element("id", "device-body").is_displayed()


def test_dark_mode_follows_the_system(operator_dashboard, browser, screenshot_dir: Path) -> None:  # noqa: F811
    driver = browser.driver
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    driver.set_window_size(1280, 1400)
    browser.load(f"{operator_dashboard}/#range=0.25&device=lab/{CAMERAS[0]}")
    _settled(driver)
    background, text, panel = driver.execute_script(
        "const s = (q, p) => getComputedStyle(document.querySelector(q))[p];"
        "return [s('body', 'backgroundColor'), s('body', 'color'), s('.chart', 'backgroundColor')]")
    luminance = lambda rgb: sum(int(v) for v in rgb[rgb.index("(") + 1:-1].split(",")[:3]) / 3  # noqa: E731
    assert luminance(background) < 40 and luminance(panel) < 50 and luminance(text) > 180, (background, text, panel)
    driver.save_screenshot(str(screenshot_dir / "operator-dark-1280.png"))
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "light"}]})
    assert luminance(driver.execute_script("return getComputedStyle(document.body).backgroundColor")) > 200
