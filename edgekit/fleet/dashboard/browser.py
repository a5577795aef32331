"""Headless Chromium through Selenium, for the dashboard's browser test and its page-load benchmark.

Uses Debian's ``chromium`` and ``chromium-driver`` (``/usr/bin/chromedriver``); nothing is downloaded.
:func:`chromium_missing` says why a browser cannot be started (for a clean skip), or None.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMEDRIVER_CANDIDATES = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1400,1000")  # fmt: skip


def _first(candidates: tuple[str, ...], name: str) -> str | None:
    return next((c for c in candidates if Path(c).is_file()), None) or shutil.which(name)


def chromium_missing() -> str | None:
    """Why headless Chromium cannot run here (package or module missing), or None when it can."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium)"
    if _first(CHROMIUM_CANDIDATES, "chromium") is None:
        return "chromium is not installed (apt-get install chromium chromium-driver)"
    if _first(CHROMEDRIVER_CANDIDATES, "chromedriver") is None:
        return "chromedriver is not installed (apt-get install chromium-driver)"
    return None


@dataclass(frozen=True)
class PageLoad:
    """Navigation timing of one page load (ms from navigation start), plus when the page said it was ready."""

    response_end_ms: float
    dom_content_loaded_ms: float
    load_event_end_ms: float
    ready_ms: float | None  # the dashboard's own mark: tables filled and plots drawn


class HeadlessChromium:
    """A headless Chromium with a fresh profile; ``with HeadlessChromium() as browser: browser.driver.get(url)``."""

    def __init__(self, page_load_timeout_s: float = 30.0) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self._profile = tempfile.TemporaryDirectory(prefix="edgekit-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = _first(CHROMIUM_CANDIDATES, "chromium") or "chromium"
        for flag in CHROMIUM_FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={self._profile.name}")
        service = Service(executable_path=_first(CHROMEDRIVER_CANDIDATES, "chromedriver") or "chromedriver")
        self.driver: Any = webdriver.Chrome(service=service, options=options)
        self.driver.set_page_load_timeout(page_load_timeout_s)

    def load(self, url: str, *, ready_timeout_s: float = 30.0) -> PageLoad:
        """Open ``url`` (a fresh load, also when only its hash differs from the page shown), wait for the dashboard's
        ready mark, and return the navigation timing."""
        from selenium.webdriver.support.ui import WebDriverWait

        if self.driver.current_url.split("#")[0] == url.split("#")[0]:
            self.driver.get("about:blank")  # else a new hash on the same page is no reload (and no new ready mark)
        self.driver.get(url)
        WebDriverWait(self.driver, ready_timeout_s).until(
            lambda d: d.execute_script("return document.body.dataset.ready === '1' || !!document.body.dataset.error")
        )
        timing = self.driver.execute_script(
            "const n = performance.getEntriesByType('navigation')[0];"
            "return [n.responseEnd, n.domContentLoadedEventEnd, n.loadEventEnd, window.edgekitReadyMs || null];"
        )
        return PageLoad(*(float(v) if v is not None else None for v in timing))  # type: ignore[arg-type]

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            self._profile.cleanup()

    def __enter__(self) -> HeadlessChromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
