"""A rollout whose ``fleet deploy`` was killed outright still says "deploying" in the store; the dashboard's rollout
row (real headless Chromium) says it has had no update for two hours, beside a rollout that is running."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from edgekit.fleet.dashboard import DashboardServer
from edgekit.fleet.dashboard.browser import chromium_missing
from edgekit.fleet.rollout_state import RolloutRecord, open_rollout_log
from edgekit.fleet.sim.seed import seed_history
from edgekit.fleet.store import open_store
from tests.fleet.dashboard.test_dashboard_browser import _settled, _wait, browser  # noqa: F401

pytestmark = pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))


def _deploying(rollout_id: str, updated: dt.datetime, devices: tuple[str, ...]) -> RolloutRecord:
    return RolloutRecord(rollout_id, "sim", f"digits-cnn-{rollout_id}-88d81029cc31", "file:///b.tar", "0" * 64, "deploying",
                         devices[:1], devices, updated - dt.timedelta(seconds=20), updated,
                         outcomes={d: "deploying" for d in devices}, options={"deploy_timeout_s": 180.0, "progress_s": 5.0})  # fmt: skip


def test_a_rollout_no_deploy_has_saved_for_hours_says_so(tmp_path, browser: Any) -> None:  # noqa: F811
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    with open_store(url) as store:
        seed_history(store, devices=3, hours=1, window_s=300)
        devices = tuple(sorted({s.device for s in store.device_summaries()}))
    now = dt.datetime.now(dt.timezone.utc)
    with open_rollout_log(url) as log:
        log.save(_deploying("killed", now - dt.timedelta(hours=2), devices))
        log.save(_deploying("running", now - dt.timedelta(seconds=10), devices))
    with DashboardServer(url, port=0, cache_s=0.0) as server:
        driver = browser.driver
        browser.load(server.url)
        _settled(driver)
        _wait(driver, "return !!document.querySelector(\"#rollouts tr[data-rollout='running']\")")
        killed = driver.find_element("css selector", "#rollouts tr[data-rollout='killed'] .rollout-state").text
        running = driver.find_element("css selector", "#rollouts tr[data-rollout='running'] .rollout-state").text
    assert "deploying" in killed and "no update for 2 h 00 min" in killed, killed
    assert "deploying" in running and "no update" not in running, running
