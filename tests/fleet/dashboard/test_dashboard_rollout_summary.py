"""Rollouts in ``/api/overview`` and ``/api/rollouts`` are summaries whose size does not grow with the devices (a
record of a rollout to 10,000 devices is 3.4 MB): devices per outcome, the devices that did not succeed (at most
50, failures first, with how many more), and the whole record at ``/api/rollout?id=ID``. Real SQLite store, real
dashboard server over HTTP, and the rollout row in a real headless Chromium."""

from __future__ import annotations

import datetime as dt
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from edgekit.fleet.dashboard import DashboardServer
from edgekit.fleet.dashboard.browser import chromium_missing
from edgekit.fleet.rollout_state import RolloutRecord, open_rollout_log
from edgekit.fleet.sim.seed import seed_history
from edgekit.fleet.store import open_store
from tests.fleet.dashboard.test_dashboard_browser import _settled, _wait, browser  # noqa: F401

#: 2,000 succeeded, 60 failed, 5 pending: the summary lists the 60 failed devices' first 50, then says 15 more.
SUCCEEDED, FAILED, PENDING = 2000, 60, 5


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _big_rollout(now: dt.datetime) -> RolloutRecord:
    names = [f"ok-{i:05d}" for i in range(SUCCEEDED)] + [f"bad-{i:03d}" for i in range(FAILED)] + [f"wait-{i}" for i in range(PENDING)]
    outcomes = {n: "succeeded" for n in names[:SUCCEEDED]} | {n: "failed" for n in names[SUCCEEDED:SUCCEEDED + FAILED]}
    outcomes |= {n: "pending" for n in names[SUCCEEDED + FAILED:]}
    results = {n: {"wave": 1 if i < 100 else 2, "outcome": o, "reason": "self-check failed: engine" if o == "failed" else "installed",
                   "step": "self_check" if o == "failed" else None, "hint": None, "seconds": 12.3}
               for i, (n, o) in enumerate(outcomes.items())}  # fmt: skip
    waves = ({"index": 1, "spec": "100", "devices": names[:100], "state": "passed", "health": {}},
             {"index": 2, "spec": "100%", "devices": names[100:], "state": "failed", "health": {}})  # fmt: skip
    return RolloutRecord("big", "sim", "demo-v3", "file:///b.tar", "0" * 64, "completed_with_failures", tuple(names[:100]),
                         tuple(names), now - dt.timedelta(minutes=5), now, finished_at=now, waves=waves,
                         previous_bundles={n: "demo-v2" for n in names}, outcomes=outcomes, device_results=results)  # fmt: skip


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('rollout-summary')}/fleet.db"
    now = dt.datetime.now(dt.timezone.utc)
    with open_store(url) as store:
        seed_history(store, fleet="sim", devices=2, hours=0.2, window_s=60.0, now=now)
    with open_rollout_log(url) as log:
        log.save(_big_rollout(now))
    with DashboardServer(url, port=0, cache_s=0.0) as server:
        yield server.url.rstrip("/")


def _check_summary(summary: dict[str, Any]) -> None:
    assert not {"outcomes", "device_results", "previous_bundles", "devices", "canary"} & set(summary), sorted(summary)
    assert summary["device_count"] == SUCCEEDED + FAILED + PENDING and summary["canary_count"] == 100
    assert summary["outcome_counts"] == {"succeeded": SUCCEEDED, "failed": FAILED, "pending": PENDING}
    listed = summary["not_succeeded"]
    assert len(listed) == 50 and summary["not_succeeded_more"] == FAILED + PENDING - 50
    assert [d["device"] for d in listed] == [f"bad-{i:03d}" for i in range(50)]  # failures first, by name
    assert listed[0] == {"device": "bad-000", "outcome": "failed", "wave": 2, "reason": "self-check failed: engine",
                         "step": "self_check", "hint": None, "seconds": 12.3}  # fmt: skip
    assert [(w["index"], w["device_count"]) for w in summary["waves"]] == [(1, 100), (2, SUCCEEDED + FAILED + PENDING - 100)]
    assert all("devices" not in w for w in summary["waves"])
    assert summary["detail"] == "/api/rollout?id=big" and summary["state"] == "completed_with_failures"


def test_overview_and_rollouts_send_a_summary_not_every_device(dashboard: str) -> None:
    status, body = _get(f"{dashboard}/api/overview")
    assert status == 200
    _check_summary(json.loads(body)["rollouts"][0])
    assert len(body) < 30_000, len(body)  # the whole record is about 500 KB
    status, body = _get(f"{dashboard}/api/rollouts")
    assert status == 200 and len(body) < 20_000, len(body)
    _check_summary(json.loads(body)[0])


def test_one_rollout_whole_record_on_request(dashboard: str) -> None:
    status, body = _get(f"{dashboard}/api/rollout?id=big")
    record = json.loads(body)
    assert status == 200 and len(record["outcomes"]) == SUCCEEDED + FAILED + PENDING
    assert record["device_results"]["bad-007"]["step"] == "self_check" and record["previous_bundles"]["ok-00001"] == "demo-v2"


@pytest.mark.parametrize(("query", "status", "message"), [
    ("", 400, "rollout needs ?id=ROLLOUT_ID"),
    ("?id=", 400, "rollout needs ?id=ROLLOUT_ID"),
    ("?id=nope", 404, "query id: no rollout 'nope' in the store; /api/rollouts lists the rollout_id of each"),
])  # fmt: skip
def test_rollout_errors_name_the_parameter(dashboard: str, query: str, status: int, message: str) -> None:
    got, body = _get(f"{dashboard}/api/rollout{query}")
    error = json.loads(body)
    assert got == status and error["parameter"] == "id" and message in error["error"], error


@pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))
def test_the_rollout_row_lists_the_devices_that_did_not_succeed_and_how_many_more(dashboard: str, browser: Any) -> None:  # noqa: F811
    driver = browser.driver
    browser.load(dashboard + "/")
    _settled(driver)
    _wait(driver, "return !!document.querySelector(\"#rollouts tr[data-rollout='big']\")")
    row = driver.find_element("css selector", "#rollouts tr[data-rollout='big']")
    assert f"{SUCCEEDED + FAILED + PENDING} devices: {SUCCEEDED} succeeded, {FAILED} failed, {PENDING} pending" in row.text, row.text
    row.find_element("css selector", "summary").click()
    listed = row.find_elements("css selector", "li")
    assert len(listed) == 50 and listed[0].get_attribute("data-outcome") == "failed"
    assert listed[0].text == "bad-000: failed (wave 2): self-check failed: engine"
    more = row.find_element("css selector", ".more-devices")
    assert more.text.startswith(f"{FAILED + PENDING - 50} more devices did not succeed, not listed here;"), more.text
    assert more.find_element("css selector", "a").get_attribute("href").endswith("/api/rollout?id=big")
