"""The dashboard with thousands of devices in a real headless Chromium at 1,280 px: the page is ready quickly, one
refresh moves a few tens of KB (the device table comes a page at a time), and the table stays usable: worst first,
paging, sorting and filtering on the server, drill-down, and the fleet selector kept in the URL.

The store holds 3,700 seeded devices (15 min of 5-minute windows each): fleet ``depot`` 3,000 online, ``yard``
500 offline (silent for 2 h), ``dock`` 200 stale (silent for 20 min)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest

from edgekit.fleet.dashboard import DashboardServer
from edgekit.fleet.dashboard.browser import HeadlessChromium, chromium_missing
from tests.fleet.dashboard.test_dashboard_browser import _settled, _wait

pytestmark = pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))

ONLINE, OFFLINE, STALE = 3000, 500, 200
DEVICES = ONLINE + OFFLINE + STALE
#: Page ready on this 2-core shared host (the issue's target, 2 s, is measured at 10,000 devices by scripts/).
READY_BUDGET_MS = 8000
REFRESH_BUDGET_BYTES = 200_000
#: Bytes each /api/ answer of one load moved (gzip as sent), from the browser's resource timing.
API_TRANSFERS = """return performance.getEntriesByType('resource').filter((e) => e.name.includes('/api/'))
  .map((e) => [new URL(e.name).pathname + new URL(e.name).search, e.transferSize, e.encodedBodySize, e.duration]);"""


@pytest.fixture(scope="module")
def big_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from edgekit.fleet.sim.seed import seed_history
    from edgekit.fleet.store import open_store

    store_url = f"sqlite:///{tmp_path_factory.mktemp('big-dashboard')}/fleet.db"
    now = dt.datetime.now(dt.timezone.utc)
    with open_store(store_url) as store:
        seed_history(store, fleet="depot", devices=ONLINE, hours=0.25, window_s=300.0, upgrade_at=None, now=now)
        seed_history(store, fleet="yard", devices=OFFLINE, hours=0.25, window_s=300.0, upgrade_at=None, now=now - dt.timedelta(hours=2))
        seed_history(store, fleet="dock", devices=STALE, hours=0.25, window_s=300.0, upgrade_at=None, now=now - dt.timedelta(minutes=20))
    with DashboardServer(store_url, port=0, cache_s=2.0) as server:  # cached as `edgekit fleet dashboard` is
        yield server.url


@pytest.fixture()
def browser() -> Iterator[HeadlessChromium]:
    with HeadlessChromium() as chromium:
        chromium.driver.set_window_size(1280, 1000)
        yield chromium


def _rows(driver: Any) -> list[tuple[str, str, str]]:
    return driver.execute_script("return [...document.querySelectorAll('#devices tbody tr')]"
                                 ".map((tr) => [tr.dataset.fleet, tr.dataset.device, tr.dataset.state || ''])")  # fmt: skip


def _column(driver: Any, index: int) -> list[str]:
    return driver.execute_script("return [...document.querySelectorAll('#devices tbody tr')]"
                                 ".map((tr) => tr.children[arguments[0]].textContent)", index)  # fmt: skip


def test_thousands_of_devices_page_ready_small_and_usable(big_dashboard: str, browser: HeadlessChromium) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    timing = browser.load(big_dashboard + "#range=1")
    driver = browser.driver
    assert driver.execute_script("return document.body.dataset.error || null") is None
    assert timing.ready_ms is not None and timing.ready_ms < READY_BUDGET_MS, timing
    transfers = driver.execute_script(API_TRANSFERS)
    assert {path.split("?")[0] for path, *_ in transfers} >= {"/api/overview", "/api/devices", "/api/fleet-series", "/api/series"}
    assert sum(size for _, size, _, _ in transfers) < REFRESH_BUDGET_BYTES, transfers
    devices_body = max(body for path, _, body, _ in transfers if path.startswith("/api/devices"))
    assert devices_body < 60_000, transfers  # 100 rows, compressed

    # counts of every state in their colours; the table a page of 100, worst first
    cards = {c.get_attribute("data-card"): c for c in driver.find_elements(By.CSS_SELECTOR, "#cards .card")}
    assert cards["devices"].find_element(By.TAG_NAME, "b").text == str(DEVICES)
    assert [cards[s].find_element(By.TAG_NAME, "b").text for s in ("online", "stale", "offline", "unknown")] == \
        [str(ONLINE), str(STALE), str(OFFLINE), "0"]  # fmt: skip
    assert cards["offline"].find_element(By.TAG_NAME, "b").value_of_css_property("color") in ("rgba(198, 40, 40, 1)", "rgb(198, 40, 40)")
    # seeded by the simulator (agent sim-1): the page says the numbers are made up
    assert cards["simulated"].find_element(By.TAG_NAME, "b").text == str(DEVICES)
    assert "simulated (SYNTHETIC numbers)" in cards["simulated"].text and "SYNTHETIC" in cards["simulated"].get_attribute("title")
    rows = _rows(driver)
    assert len(rows) == 100 and {state for _, _, state in rows} == {"offline"} and {f for f, _, _ in rows} == {"yard"}
    assert driver.find_element(By.ID, "page-position").text == f"1–100 of {DEVICES}"
    assert driver.find_element(By.ID, "worst-first").get_attribute("aria-pressed") == "true"

    # paging: the next page, then the last rows of the offline devices and the first stale ones
    driver.find_element(By.ID, "page-next").click()
    _settled(driver)
    assert driver.find_element(By.ID, "page-position").text == f"101–200 of {DEVICES}"
    assert not {d for _, d, _ in _rows(driver)} & {d for _, d, _ in rows}
    Select(driver.find_element(By.ID, "page-size")).select_by_value("500")
    _settled(driver)
    states = [state for _, _, state in _rows(driver)]
    assert len(states) == 500 and states == ["offline"] * OFFLINE  # the first 500 again, all offline
    driver.find_element(By.ID, "page-next").click()
    _settled(driver)
    assert [state for _, _, state in _rows(driver)][:STALE] == ["stale"] * STALE

    # sorting by a column on the server: p99 ascending over all 3,700, not within a page
    driver.find_element(By.CSS_SELECTOR, "#devices th[data-key='p99_ms']").click()
    _settled(driver)
    assert driver.find_element(By.ID, "page-position").text == f"1–500 of {DEVICES}"
    p99 = [float(v) for v in _column(driver, 8)]
    assert p99 == sorted(p99) and len(p99) == 500
    assert driver.find_element(By.CSS_SELECTOR, "#devices th[data-key='p99_ms']").get_attribute("aria-sort") == "ascending"

    # the filter (debounced, on the server) and the drill-down from a filtered row
    driver.find_element(By.ID, "filter").send_keys("raspberry-pi-5-01")
    _settled(driver)
    shown = _rows(driver)
    assert shown and all(d.startswith("raspberry-pi-5-01") for _, d, _ in shown)
    assert driver.find_element(By.ID, "device-count").text == f"{len(shown)} of {DEVICES} match"
    fleet, device = next((f, d) for f, d, s in shown if s == "online")
    driver.find_element(By.CSS_SELECTOR, f"#devices tr[data-fleet='{fleet}'][data-device='{device}']").click()
    _wait(driver, f"return document.querySelector('#chart-latency figcaption').textContent.startsWith('{device}:')")
    assert f"device={fleet}%2F{device}" in driver.current_url or f"device={fleet}/{device}" in driver.current_url

    # the fleet selector: in the URL, applied to the overview, the table and the fleet charts
    Select(driver.find_element(By.ID, "fleet")).select_by_value("dock")
    _wait(driver, "return document.querySelector('#cards .card b').textContent === '200'")
    _settled(driver)
    assert "fleet=dock" in driver.current_url
    driver.find_element(By.ID, "filter").clear()
    driver.execute_script("document.getElementById('filter').dispatchEvent(new Event('input'))")
    _settled(driver)
    assert {f for f, _, _ in _rows(driver)} == {"dock"}
    asked = [path for path, *_ in driver.execute_script(API_TRANSFERS)][len(transfers):]
    assert any(p.startswith("/api/fleet-series") and "fleet=dock" in p for p in asked), asked
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []

    # the fleet in the URL survives a reload
    browser.load(driver.current_url)
    assert driver.find_element(By.ID, "fleet").get_attribute("value") == "dock"
    assert {f for f, _, _ in _rows(driver)} == {"dock"}

    # a fleet in the URL that the store does not know: every fleet; a device it does not know: the page says so and
    # shows no other device in its place (issue 32 item 4)
    browser.load(big_dashboard + "#fleet=nowhere&device=depot/no-such-device")
    assert driver.find_element(By.ID, "fleet").get_attribute("value") == ""
    assert "no fleet nowhere" in driver.find_element(By.ID, "updated").text
    _wait(driver, "return !document.getElementById('device-missing').hidden")
    assert driver.find_element(By.ID, "device-missing").text.startswith("No device no-such-device in fleet depot")
    assert driver.find_elements(By.CSS_SELECTOR, "#devices tr.selected") == [] and "fleet=" not in driver.current_url
    assert len(_rows(driver)) == 500 or len(_rows(driver)) == 100
    print(json.dumps({"ready_ms": timing.ready_ms, "api": transfers}))
