"""``/api/overview`` (devices per state, fleets, events with their fleet; no device list) and ``/api/devices`` (one
page of the device table, filtered and sorted on the server), over real HTTP against a seeded SQLite store whose
devices are online, stale, offline, unknown and ``updating`` (see ``fleets_dashboard`` in conftest.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest


def _get(base: str, path: str, **params: Any) -> tuple[int, dict[str, Any]]:
    url = base + path + ("?" + urllib.parse.urlencode(params) if params else "")
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _devices(base: str, **params: Any) -> dict[str, Any]:
    status, body = _get(base, "api/devices", **params)
    assert status == 200, body
    return body


def test_overview_counts_every_state_and_lists_fleets_but_no_devices(fleets_dashboard) -> None:
    status, data = _get(fleets_dashboard.url, "api/overview")
    assert status == 200 and "devices" not in data
    assert data["counts"].pop("breaching") == 0  # no alert fired
    assert data["counts"].pop("simulated") == 17  # the simulator's devices (agent sim-1): the page says SYNTHETIC
    assert data["counts"] == {"devices": 18, "states": {"online": 11, "stale": 3, "offline": 2, "unknown": 1, "updating": 1}}
    assert list(data["counts"]["states"])[:4] == ["online", "stale", "offline", "unknown"]  # the four first, always
    assert data["fleets"] == ["a", "b", "c", "d"]
    assert {(e["fleet"], e["device"]) for e in data["events"]} == {("b", "jetson-orin-nx-16gb-001"), ("a", "raspberry-pi-5-002")}
    status, only_c = _get(fleets_dashboard.url, "api/overview", fleet="c")
    assert only_c["counts"].pop("breaching") == 0
    assert only_c["counts"].pop("simulated") == 2
    assert only_c["counts"] == {"devices": 2, "states": {"online": 0, "stale": 0, "offline": 2, "unknown": 0}}
    assert only_c["fleets"] == ["a", "b", "c", "d"] and only_c["fleet"] == "c" and only_c["events"] == []  # the selector keeps all


def test_worst_first_is_the_default_order(fleets_dashboard) -> None:
    page = _devices(fleets_dashboard.url)
    assert (page["sort"], page["order"], page["offset"], page["limit"], page["total"]) == ("worst", "asc", 0, 100, 18)
    states = [d["state"] for d in page["devices"]]
    assert states == ["offline"] * 2 + ["stale"] * 3 + ["updating", "unknown"] + ["online"] * 11 or \
        states == ["offline"] * 2 + ["stale"] * 3 + ["unknown", "updating"] + ["online"] * 11
    online = [d["p99_ms"] for d in page["devices"] if d["state"] == "online"]
    assert online == sorted(online, reverse=True) and online[0] > online[-1]  # the highest p99 first among equals
    stale = [d["p99_ms"] for d in page["devices"] if d["state"] == "stale"]
    assert stale == sorted(stale, reverse=True)
    assert _devices(fleets_dashboard.url, order="desc")["devices"][0]["state"] == "online"  # best first


def test_pages_cover_the_table_once(fleets_dashboard) -> None:
    whole = [(d["fleet"], d["device"]) for d in _devices(fleets_dashboard.url, sort="device")["devices"]]
    paged = []
    for offset in range(0, 18, 5):
        page = _devices(fleets_dashboard.url, sort="device", offset=offset, limit=5)
        assert page["total"] == 18 and len(page["devices"]) == min(5, 18 - offset)
        paged += [(d["fleet"], d["device"]) for d in page["devices"]]
    assert paged == whole and len(set(paged)) == 18
    assert _devices(fleets_dashboard.url, offset=100)["devices"] == []  # past the end: an empty page, the total kept


@pytest.mark.parametrize("column", ["p99_ms", "p50_ms", "last_seen", "device", "fleet", "temperature_c"])
def test_sorting_by_a_column_puts_empty_values_last(fleets_dashboard, column: str) -> None:
    for order in ("asc", "desc"):
        rows = _devices(fleets_dashboard.url, sort=column, order=order)["devices"]
        values = [d[column] for d in rows]
        present = [v for v in values if v is not None]
        assert present == sorted(present, reverse=order == "desc"), (column, order)
        assert values[len(present):] == [None] * (len(values) - len(present))  # ghost-1 has no telemetry: last


def test_filters_by_text_state_and_fleet(fleets_dashboard) -> None:
    pis = _devices(fleets_dashboard.url, q="RASPBERRY")
    assert pis["total"] == 6 and pis["fleet_devices"] == 18  # fleet a: 4 of 12 (002, 005, 008, 011), b: 002, d: ghost-1's target
    assert all(d["target"] == "raspberry-pi-5" for d in pis["devices"])
    worst = _devices(fleets_dashboard.url, state="offline,stale")
    assert worst["total"] == 5 and {d["fleet"] for d in worst["devices"]} == {"b", "c"}
    both = _devices(fleets_dashboard.url, state="stale", q="nx")
    assert [(d["fleet"], d["device"]) for d in both["devices"]] == [("b", "jetson-orin-nx-16gb-001")]
    fleet_a = _devices(fleets_dashboard.url, fleet="a", sort="p99_ms", order="desc", limit=3)
    assert fleet_a["total"] == fleet_a["fleet_devices"] == 12 and {d["fleet"] for d in fleet_a["devices"]} == {"a"}
    assert fleet_a["devices"][0]["target"] == "raspberry-pi-5"  # the slowest board
    assert _devices(fleets_dashboard.url, q="updating")["total"] == 1  # the agent-reported state is searched too
    assert _devices(fleets_dashboard.url, q="no-such-device")["devices"] == []


@pytest.mark.parametrize(("params", "parameter", "message"), [
    ({"limit": "0"}, "limit", "limit must be between 1 and 1000, got 0"),
    ({"limit": "5000"}, "limit", "limit must be between 1 and 1000"),
    ({"limit": "ten"}, "limit", "limit must be an integer, got 'ten'"),
    ({"offset": "-1"}, "offset", "offset must be between 0 and 4611686018427387904"),
    ({"sort": "colour"}, "sort", "sort must be one of worst, device"),
    ({"sort": "models"}, "sort", "got 'models'"),
    ({"order": "up"}, "order", "order must be asc or desc"),
    ({"state": "off line"}, "state", "state 'off line' is not a state name"),
    ({"q": "x" * 201}, "q", "q must be at most 200 characters"),
    ({"offset": str(2**64)}, "offset", "offset must be between 0 and 4611686018427387904"),  # was a 500 from the SQL
    ({"q": "a\x00"}, "q", "q must not contain control characters"),  # SQLite matched every device, PostgreSQL a 500
    ({"hours": "abc"}, "hours", "hours must be a number"),
])  # fmt: skip
def test_bad_parameters_are_400_naming_the_parameter(fleets_dashboard, params: dict[str, str], parameter: str, message: str) -> None:
    status, body = _get(fleets_dashboard.url, "api/devices", **params)
    assert status == 400 and body["parameter"] == parameter and message in body["error"], body


def test_an_unknown_fleet_is_404(fleets_dashboard) -> None:
    status, body = _get(fleets_dashboard.url, "api/devices", fleet="z")
    assert status == 404 and "query fleet 'z'" in body["error"] and "a, b, c, d" in body["error"]


def test_overview_counts_devices_breaching_an_alert(tmp_path) -> None:
    """Alert events as the collector stores them (edgekit.fleet.alerts.notify): a device with two rules firing
    counts once, one whose alert resolved not at all, and the fleet selector applies."""
    import datetime as dt

    from edgekit.fleet.alerts import notify
    from edgekit.fleet.dashboard import DashboardServer
    from edgekit.fleet.sim.seed import seed_history
    from edgekit.fleet.store import open_store

    now = dt.datetime.now(dt.timezone.utc)

    def event(n: int, status: str, rule: str, fleet: str, device: str) -> Any:
        message = notify.alert_message(event_id=f"e{n}", status=status, rule=rule, kind="p99_above", severity="warning",
                                       fleet=fleet, subject=device, device=device, value=30.0, threshold=20.0,
                                       summary=f"{device} p99 30 ms", labels={}, description=None, details={},
                                       pending_since=now - dt.timedelta(minutes=2), fired_at=now - dt.timedelta(minutes=1),
                                       resolved_at=now if status == "resolved" else None)  # fmt: skip
        return notify.alert_event(message, now - dt.timedelta(seconds=60 - n))

    store_url = f"sqlite:///{tmp_path}/fleet.db"
    with open_store(store_url) as store:
        seed_history(store, fleet="a", devices=3, hours=0.1, window_s=60.0, now=now)
        seed_history(store, fleet="b", devices=2, hours=0.1, window_s=60.0, now=now)
        store.add_events([event(1, "firing", "p99", "a", "jetson-orin-nano-8gb-000"),
                          event(2, "firing", "temperature", "a", "jetson-orin-nano-8gb-000"),
                          event(3, "firing", "p99", "a", "jetson-orin-nx-16gb-001"),
                          event(4, "resolved", "p99", "a", "jetson-orin-nx-16gb-001"),
                          event(5, "firing", "p99", "b", "jetson-orin-nano-8gb-000")])  # fmt: skip
    with DashboardServer(store_url, port=0, cache_s=0.0) as server:
        assert _get(server.url, "api/overview")[1]["counts"]["breaching"] == 2
        assert _get(server.url, "api/overview", fleet="a")[1]["counts"]["breaching"] == 1
        rows = _devices(server.url, fleet="a")["devices"]  # all online: the one breaching first, then by p99
        assert [(d["device"], d["breaching"]) for d in rows] == [("jetson-orin-nano-8gb-000", True), ("raspberry-pi-5-002", False),
                                                                 ("jetson-orin-nx-16gb-001", False)]  # fmt: skip


@pytest.mark.parametrize("name", ["app.js%00.css", "a" * 300 + ".js"])
def test_static_names_the_file_system_refuses_are_404(fleets_dashboard, name: str) -> None:
    try:
        with urllib.request.urlopen(fleets_dashboard.url + "static/" + name, timeout=30) as response:
            status = response.status
    except urllib.error.HTTPError as err:
        status = err.code
    assert status == 404  # was a 500 (embedded null byte, name too long)

