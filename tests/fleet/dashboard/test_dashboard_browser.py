"""The dashboard in a real headless Chromium: devices listed, sorted and filtered, plots drawn by uPlot with
the resolution the time range asks for, a 20 s spike kept at the 1 h range, the quick start's lines within
30 s, the empty store's hint, and no horizontal overflow at 1,280 and 1,920 px (screenshots kept under
``$EDGEKIT_SCREENSHOT_DIR`` when set, else in the test's tmp dir)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgekit.fleet.dashboard import DashboardServer
from edgekit.fleet.dashboard.browser import HeadlessChromium, chromium_missing

pytestmark = pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))

#: The plotted data of one chart, read from its uPlot instance: {series label: [values]} plus x in ms.
PLOTTED = """const u = window.edgekitCharts[arguments[0]];
if (!u) return null;
const out = {x: u.data[0].map((t) => t * 1000), series: {}, titles: {}};
u.series.slice(1).forEach((s, i) => { out.series[s.label] = u.data[i + 1]; });
u.root.querySelectorAll('.u-legend .u-series').forEach((row, i) => { if (i > 0) out.titles[row.textContent.split(':')[0].trim()] = row.title; });
return out;"""
OVERFLOW = "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]"


def _plotted(driver: Any, chart: str) -> dict[str, Any]:
    return driver.execute_script(PLOTTED, chart)


def _values(plotted: dict[str, Any], label: str) -> list[float]:
    return [v for v in plotted["series"][label] if v is not None]


def _wait(driver: Any, condition: str, timeout_s: float = 10.0) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout_s).until(lambda d: d.execute_script(condition))


def _settled(driver: Any) -> None:
    _wait(driver, "return !document.body.dataset.loading")


@pytest.fixture()
def browser() -> Iterator[HeadlessChromium]:
    with HeadlessChromium() as chromium:
        yield chromium


@pytest.fixture()
def screenshot_dir(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("EDGEKIT_SCREENSHOT_DIR") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_page_shows_devices_and_draws_plots(seeded_dashboard, browser) -> None:
    from selenium.webdriver.common.by import By

    timing = browser.load(seeded_dashboard.url + "#range=24")
    driver = browser.driver
    assert driver.execute_script("return document.body.dataset.error || null") is None
    rows = driver.find_elements(By.CSS_SELECTOR, "#devices tbody tr")
    assert sorted(r.get_attribute("data-device") for r in rows) == sorted(seeded_dashboard.devices)
    cells = [c.text for c in rows[0].find_elements(By.TAG_NAME, "td")]
    assert cells[1] == "sim" and cells[2] == "online" and cells[3] in ("demo-v1", "demo-v2") and float(cells[8]) > 0  # p99 ms
    assert cells[6] in ("15W", "MAXN+clocks", "–")  # power mode, as the device reported it
    assert cells[4] == ""  # models: hidden, no simulated device names its models
    p99 = [float(r.find_elements(By.TAG_NAME, "td")[8].text) for r in rows]
    assert p99 == sorted(p99, reverse=True)  # worst first: all online, so the highest p99 first
    assert "online" in driver.find_element(By.CSS_SELECTOR, "#devices td.state").get_attribute("class")
    color = driver.find_element(By.CSS_SELECTOR, "#devices td.state").value_of_css_property("color")
    assert color in ("rgba(46, 125, 50, 1)", "rgb(46, 125, 50)")  # online: green
    assert driver.find_element(By.CSS_SELECTOR, "#devices th[data-key='power_mode']").is_displayed()
    for chart in ("chart-latency", "chart-power", "chart-temperature", "chart-bundles", "chart-fleet-power"):
        assert int(driver.find_element(By.ID, chart).get_attribute("data-points")) > 10, chart
        assert driver.find_elements(By.CSS_SELECTOR, f"#{chart} canvas"), chart
    latency = _plotted(driver, "chart-latency")
    assert set(latency["series"]) == {"p50", "p99 (worst window)"}
    assert min(_values(latency, "p99 (worst window)")) > max(_values(latency, "p50")) * 0.9
    # the store holds 6 h: the 24 h range spreads its points over those 6 h (one per 2-minute window), not 1 in 4 h
    assert 179 <= len(latency["x"]) <= 181 and latency["x"][1] - latency["x"][0] == 120_000
    power, temperature = _plotted(driver, "chart-power"), _plotted(driver, "chart-temperature")
    assert all(1.0 < w < 40.0 for w in _values(power, "mean power"))  # watts on their own chart, not mW or °C / 10
    assert all(20.0 < c < 110.0 for c in _values(temperature, "hottest sensor"))
    assert "(W)" in driver.find_element(By.CSS_SELECTOR, "#chart-power figcaption").text
    assert "(°C)" in driver.find_element(By.CSS_SELECTOR, "#chart-temperature figcaption").text
    assert set(_plotted(driver, "chart-bundles")["series"]) == {"demo-v1", "demo-v2"}
    assert "24 h, one point per 2 min" in driver.find_element(By.ID, "resolution").text
    assert "malformed_json" in driver.find_element(By.ID, "rejected").text
    assert "completed" in driver.find_element(By.ID, "rollouts").text
    # the rollout is marked on the fleet charts and on the charts of the devices it deployed to
    first = driver.find_element(By.ID, "selected").text.split(" ")[0]
    in_rollout = first in ("jetson-orin-nano-8gb-000", "jetson-orin-nx-16gb-001")
    assert driver.find_element(By.ID, "chart-bundles").get_attribute("data-markers") == "1"
    assert driver.find_element(By.ID, "chart-latency").get_attribute("data-markers") == ("1" if in_rollout else "0")
    assert timing.load_event_end_ms > 0 and timing.ready_ms is not None and timing.ready_ms < 10_000
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []  # no script error, no CSP refusal

    # the range picker: 15 min reads the raw 2-minute windows one by one
    driver.find_element(By.CSS_SELECTOR, "#range button[data-hours='0.25']").click()
    _wait(driver, "return document.getElementById('resolution').textContent.startsWith('15 min')")
    _settled(driver)
    recent = _plotted(driver, "chart-latency")
    assert 6 <= len(recent["x"]) <= 8 and all(b - a == 120_000 for a, b in zip(recent["x"], recent["x"][1:]))
    assert "range=0.25" in driver.current_url

    # drill down: clicking another device redraws its plots and names it in the URL
    other = "raspberry-pi-5-005"
    driver.find_element(By.CSS_SELECTOR, f"#devices tr[data-device='{other}']").click()
    _wait(driver, f"return document.querySelector('#chart-latency figcaption').textContent.startsWith('{other}:')")
    assert other in driver.find_element(By.ID, "selected").text and other in driver.current_url
    assert driver.find_element(By.ID, "chart-latency").get_attribute("data-markers") == "0"  # raspberry-pi-5-005: not in r1
    assert "selected" in driver.find_element(By.CSS_SELECTOR, f"#devices tr[data-device='{other}']").get_attribute("class")

    # the fleet charts by target instead of bundle
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.ID, "group-by")).select_by_value("target")
    _wait(driver, "return document.querySelector('#chart-bundles figcaption').textContent.includes('by target')")
    _settled(driver)
    targets = set(_plotted(driver, "chart-bundles")["series"])
    assert targets == {"jetson-orin-nano-8gb", "jetson-orin-nx-16gb", "raspberry-pi-5"}
    Select(driver.find_element(By.ID, "group-by")).select_by_value("power_mode")
    _wait(driver, "return document.querySelector('#chart-bundles figcaption').textContent.includes('by power mode')")
    _settled(driver)
    assert set(_plotted(driver, "chart-bundles")["series"]) == {"15W", "MAXN+clocks", "(not reported)"}
    assert "by=power_mode" in driver.current_url

    # filtering on the power mode column (on the server, once typing pauses)
    driver.find_element(By.ID, "filter").send_keys("MAXN")
    _settled(driver)
    shown = [r.get_attribute("data-device") for r in driver.find_elements(By.CSS_SELECTOR, "#devices tbody tr")]
    assert shown and all(name.startswith("jetson-orin-nx-16gb-") for name in shown)


def test_device_table_sorts_filters_and_scrolls(tmp_path, browser) -> None:
    from selenium.webdriver.common.by import By

    from edgekit.fleet.sim.seed import seed_history
    from edgekit.fleet.store import open_store

    store_url = f"sqlite:///{tmp_path}/fleet.db"
    with open_store(store_url) as store:
        seed_history(store, devices=60, hours=0.5, window_s=300.0)
    with DashboardServer(store_url, port=0, cache_s=0.0) as server:
        browser.driver.set_window_size(1280, 900)
        browser.load(server.url)
        driver = browser.driver
        assert len(driver.find_elements(By.CSS_SELECTOR, "#devices tbody tr")) == 60  # all rows, in a scroller
        assert not driver.find_element(By.CSS_SELECTOR, "#devices th[data-key='power_mode']").is_displayed()  # none reported
        scroller = driver.find_element(By.ID, "devices-scroll")
        height, content = driver.execute_script("return [arguments[0].clientHeight, arguments[0].scrollHeight]", scroller)
        assert height < content and height <= 0.6 * 900 + 1
        driver.execute_script("arguments[0].scrollTop = arguments[0].scrollHeight", scroller)
        header_top = driver.execute_script("return document.querySelector('#devices th').getBoundingClientRect().top")
        assert abs(header_top - scroller.rect["y"]) < 3  # the header row stays in view while the rows scroll

        header = driver.find_element(By.CSS_SELECTOR, "#devices th[data-key='p99_ms']")
        header.click()
        _settled(driver)
        header.click()  # descending
        _settled(driver)
        assert header.get_attribute("aria-sort") == "descending"
        p99 = [float(r.find_elements(By.TAG_NAME, "td")[8].text) for r in driver.find_elements(By.CSS_SELECTOR, "#devices tbody tr")]
        assert p99 == sorted(p99, reverse=True) and p99[0] > p99[-1]

        driver.find_element(By.ID, "filter").send_keys("raspberry")
        _settled(driver)
        shown = driver.find_elements(By.CSS_SELECTOR, "#devices tbody tr")
        assert len(shown) == 20 and all(r.get_attribute("data-device").startswith("raspberry-pi-5-") for r in shown)
        assert driver.find_element(By.ID, "device-count").text == "20 of 60 match"


def test_a_20_second_spike_keeps_its_height_at_the_1_hour_range(tmp_path, browser) -> None:
    import json
    import urllib.parse
    import urllib.request

    from edgekit.fleet.dashboard.scenes import seed_spike
    from edgekit.fleet.store import open_store

    store_url = f"sqlite:///{tmp_path}/fleet.db"
    with open_store(store_url) as store:
        spike = seed_spike(store, hours=1.0, window_s=10.0, spike_s=20.0)
    with DashboardServer(store_url, port=0, cache_s=0.0) as server:
        browser.load(server.url + "#range=1")
        plotted = _plotted(browser.driver, "chart-latency")
        query = urllib.parse.urlencode({"fleet": spike.fleet, "device": spike.device, "hours": 1})
        with urllib.request.urlopen(server.url + f"api/series?{query}", timeout=10) as response:
            data = json.loads(response.read())
    assert data["bucket_s"] == 30  # three 10 s windows a point: the spike's two windows share a bucket with a normal one
    assert max(_values(plotted, "p99 (worst window)")) == spike.p99_ms == pytest.approx(3 * spike.baseline_p99_max_ms, abs=1e-3)
    assert max(v for v in data["series"]["p99_ms"] if v is not None) < 0.9 * spike.p99_ms  # what a bucket mean would show
    assert sum(1 for v in _values(plotted, "p99 (worst window)") if v == spike.p99_ms) in (1, 2)


def test_quick_start_draws_lines_within_30_seconds(tmp_path, browser) -> None:
    pytest.importorskip("amqtt", reason="amqtt is not installed (pip install amqtt)")
    from edgekit.fleet.local_stack import LocalStack, LocalStackConfig

    # `edgekit fleet up --simulate 3`: the embedded broker, the collector, and one 10 s window per device
    config = LocalStackConfig(broker_port=0, store_url=f"sqlite:///{tmp_path}/fleet.db", dashboard_port=0, simulate=3)
    started = time.monotonic()
    with LocalStack(config) as stack:
        browser.driver.get(stack.dashboard_url)  # opened at once, as the quick start says; it refreshes itself
        _wait(browser.driver, "const f = document.getElementById('chart-latency');"
              "return !document.getElementById('device-charts').hidden && f && Number(f.dataset.points) > 2", 40)  # fmt: skip
        elapsed = time.monotonic() - started
        plotted = _plotted(browser.driver, "chart-latency")
        fleet = _plotted(browser.driver, "chart-bundles")
    assert elapsed <= 30.0, f"lines appeared after {elapsed:.1f} s"
    assert len(_values(plotted, "p50")) > 1 and len(_values(plotted, "p99 (worst window)")) > 1
    assert len(_values(fleet, "demo-v1")) > 1
    assert plotted["x"][1] - plotted["x"][0] == 10_000  # one point per 10 s window, not a 5-minute bucket


def test_empty_store_says_what_to_run(tmp_path, browser, screenshot_dir) -> None:
    from selenium.webdriver.common.by import By

    store_url = f"sqlite:///{tmp_path}/fleet.db"
    with DashboardServer(store_url, port=0, cache_s=0.0) as server:
        browser.load(server.url)
        driver = browser.driver
        hint = driver.find_element(By.ID, "empty")
        assert hint.is_displayed() and "edgekit fleet up --simulate 20" in hint.text and store_url in hint.text
        for section in ("devices-section", "device-charts", "fleet-charts", "cards"):
            assert not driver.find_element(By.ID, section).is_displayed(), section
        driver.save_screenshot(str(screenshot_dir / "empty-1280.png"))


@pytest.mark.parametrize("width", [1280, 1920])
def test_no_horizontal_overflow_and_distinct_legends(tmp_path, browser, screenshot_dir, width: int) -> None:
    from selenium.webdriver.common.by import By

    from edgekit.fleet.dashboard.scenes import LONG_BUNDLES, LONG_REASON, seed_long_names
    from edgekit.fleet.store import open_store

    store_url = f"sqlite:///{tmp_path}/fleet.db"
    with open_store(store_url) as store:
        seed_long_names(store)
    with DashboardServer(store_url, port=0, cache_s=0.0) as server:
        driver = browser.driver
        driver.set_window_size(width, 1000)
        browser.load(server.url + "#range=24")
        scroll_width, client_width = driver.execute_script(OVERFLOW)
        assert scroll_width <= client_width, f"page is {scroll_width} px wide in a {client_width} px window"
        assert LONG_REASON.strip()[:60] in driver.find_element(By.ID, "rollouts").text  # wrapped, not cut or hidden
        inner = driver.execute_script("const s = document.getElementById('rollouts').parentElement; return [s.scrollWidth, s.clientWidth]")
        assert inner[0] <= inner[1]  # the rollout table fits its box too: no sideways scrolling to read the reason
        bundle = driver.find_element(By.CSS_SELECTOR, "#bundles tbody td .clip")
        assert bundle.get_attribute("title") == LONG_BUNDLES[1] and bundle.text.endswith("int8-2026-11-20")  # the end is kept
        columns = driver.execute_script("return getComputedStyle(document.querySelector('.charts')).gridTemplateColumns.split(' ').length")
        assert columns == (2 if width == 1280 else 3)
        legend = _plotted(driver, "chart-bundles")
        labels = list(legend["series"])
        assert len(labels) == 2 and len(set(labels)) == 2 and all(len(label) <= 32 for label in labels)
        assert sorted(legend["titles"].values()) == sorted(LONG_BUNDLES)  # full names in the tooltips
        driver.set_window_size(width, driver.execute_script("return document.documentElement.scrollHeight") + 20)
        driver.save_screenshot(str(screenshot_dir / f"long-names-{width}.png"))
        assert driver.execute_script(OVERFLOW)[0] <= client_width


def test_refresh_updates_the_charts_and_keeps_a_zoom(seeded_dashboard, browser) -> None:
    browser.load(seeded_dashboard.url + "#range=24")
    driver = browser.driver
    driver.execute_script("window.keptChart = window.edgekitCharts['chart-latency'];"
                          "const u = window.keptChart, x = u.data[0];"
                          "u.setScale('x', {min: x[10], max: x[40]});")  # fmt: skip  # as a drag across the chart does
    zoom = driver.execute_script("const u = window.keptChart; return [u.scales.x.min, u.scales.x.max, u.edgekit.zoomed]")
    driver.execute_async_script("refresh(false).then(arguments[0])")  # what the page does every 10 s
    same, after = driver.execute_script("const u = window.edgekitCharts['chart-latency'];"
                                        "return [u === window.keptChart, [u.scales.x.min, u.scales.x.max]]")  # fmt: skip
    assert zoom[2] is True and same and after == zoom[:2]  # the same chart, new data, still zoomed
    driver.execute_script("window.keptChart.setData(window.keptChart.data)")  # zoom out (as a double-click does)
    assert driver.execute_script("return window.keptChart.edgekit.zoomed") is False
    driver.execute_script("const u = window.keptChart, x = u.data[0]; u.setScale('x', {min: x[10], max: x[40]});")
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, "#range button[data-hours='1']").click()  # another range: zoom dropped
    _wait(driver, "return document.getElementById('resolution').textContent.startsWith('1 h')")
    _settled(driver)
    shown = driver.execute_script("const u = window.edgekitCharts['chart-latency'], x = u.data[0];"
                                  "return [u.scales.x.min <= x[0], u.scales.x.max >= x[x.length - 1], u.edgekit.zoomed]")  # fmt: skip
    assert shown == [True, True, False]
