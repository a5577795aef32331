"""The dashboard in a real headless Chromium: the page loads, lists the seeded devices, and plots draw."""

from __future__ import annotations

import pytest

from edgekit.fleet.dashboard.browser import HeadlessChromium, chromium_missing

pytestmark = pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))


def test_page_shows_devices_and_draws_plots(seeded_dashboard) -> None:
    from selenium.webdriver.common.by import By

    with HeadlessChromium() as browser:
        timing = browser.load(seeded_dashboard.url)
        driver = browser.driver
        assert driver.execute_script("return document.body.dataset.error || null") is None
        rows = driver.find_elements(By.CSS_SELECTOR, "#devices tbody tr")
        assert sorted(r.get_attribute("data-device") for r in rows) == sorted(seeded_dashboard.devices)
        first = driver.find_element(By.CSS_SELECTOR, "#devices tbody tr")
        cells = [c.text for c in first.find_elements(By.TAG_NAME, "td")]
        assert cells[1] == "online" and cells[2] in ("demo-v1", "demo-v2") and float(cells[5]) > 0  # p99 ms
        for chart in ("chart-latency", "chart-power", "chart-bundles"):
            figure = driver.find_element(By.ID, chart)
            assert int(figure.get_attribute("data-points")) > 10, chart
            paths = figure.find_elements(By.CSS_SELECTOR, "svg path.line")
            assert paths and all(len(p.get_attribute("d")) > 50 for p in paths), chart
        bundles = {p.get_attribute("data-series") for p in driver.find_elements(By.CSS_SELECTOR, "#chart-bundles path.line")}
        assert bundles == {"demo-v1", "demo-v2"}
        assert "malformed_json" in driver.find_element(By.ID, "rejected").text
        assert "completed" in driver.find_element(By.ID, "rollouts").text
        # clicking another device redraws its plots
        from selenium.webdriver.support.ui import WebDriverWait

        other = rows[-1].get_attribute("data-device")
        rows[-1].click()
        WebDriverWait(driver, 10).until(lambda d: other in d.find_element(By.ID, "selected").text)
        WebDriverWait(driver, 10).until(
            lambda d: other in d.find_element(By.CSS_SELECTOR, "#chart-latency svg").get_attribute("aria-label"))
        assert timing.load_event_end_ms > 0 and timing.ready_ms is not None and timing.ready_ms < 10_000
