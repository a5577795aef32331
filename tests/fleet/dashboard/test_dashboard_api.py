"""The dashboard's JSON endpoints and its small HTTP server, over real HTTP."""

from __future__ import annotations

import datetime as dt
import gzip
import http.client
import json
import urllib.error
import urllib.parse
import urllib.request

import pytest

from edgekit.fleet.dashboard.api import bucket_for, device_series, fleet_series
from edgekit.fleet.dashboard.scenes import seed_spike
from edgekit.fleet.sim.seed import seed_history


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_overview_lists_seeded_devices_bundles_rollouts_and_rejections(seeded_dashboard) -> None:
    status, headers, body = _get(seeded_dashboard.url + "api/overview")
    assert status == 200 and headers["Content-Type"] == "application/json"
    data = json.loads(body)
    assert "devices" not in data  # the table comes a page at a time from /api/devices
    assert data["counts"]["devices"] == 6 and data["counts"]["states"] == {"online": 6, "stale": 0, "offline": 0, "unknown": 0}
    assert data["fleets"] == ["sim"]
    table = json.loads(_get(seeded_dashboard.url + "api/devices")[2])
    assert sorted(d["device"] for d in table["devices"]) == sorted(seeded_dashboard.devices) and table["total"] == 6
    row = table["devices"][0]
    assert row["p99_ms"] > row["p50_ms"] > 0 and row["power_mw"] > 0 and row["target"]
    assert [b["bundle_id"] for b in data["bundles"]] == ["demo-v2"] and data["bundles"][0]["devices"] == 6
    assert data["rejected"] == {"malformed_json": 2}
    assert data["rollouts"][0]["state"] == "completed"


def test_series_are_downsampled_in_the_store(seeded_dashboard) -> None:
    device = seeded_dashboard.devices[0]
    query = urllib.parse.urlencode({"fleet": "sim", "device": device, "hours": 6, "points": 30})
    data = json.loads(_get(seeded_dashboard.url + f"api/series?{query}")[2])
    series = data["series"]
    assert data["bucket_s"] == 900 and 20 <= len(series["t"]) <= 31  # 6 h of 2-minute windows in 15-minute buckets
    assert len(series["p99_ms"]) == len(series["t"]) and all(v > 0 for v in series["p99_ms"])
    bundles = json.loads(_get(seeded_dashboard.url + "api/bundle-series?hours=6&points=30")[2])["bundles"]
    assert set(bundles) == {"demo-v1", "demo-v2"} and bundles["demo-v1"]["t"][0] < bundles["demo-v2"]["t"][-1]


@pytest.mark.parametrize(("path", "status", "message"), [
    ("api/series?fleet=sim", 400, "series needs ?fleet=F&device=D"),
    ("api/series?fleet=sim&device=x&hours=abc", 400, "hours must be a number"),
    ("api/overview?points=1", 400, "points must be in [2, 2000], got 1"),
    ("api/devices?limit=0", 400, "limit must be between 1 and 1000"),
    ("api/nothing", 404, "no API endpoint 'nothing'"),
    ("static/..%2Fapp.py", 404, "no static file"),
    ("static/app.py", 404, "no static file"),
    ("elsewhere", 404, "no page at /elsewhere"),
])  # fmt: skip
def test_bad_requests_get_json_errors(seeded_dashboard, path: str, status: int, message: str) -> None:
    got, _, body = _get(seeded_dashboard.url + path)
    assert got == status and message in json.loads(body)["error"]


def test_page_assets_are_served_offline_and_compressed(seeded_dashboard) -> None:
    status, headers, body = _get(seeded_dashboard.url, {"Accept-Encoding": "gzip"})
    page = gzip.decompress(body).decode() if headers.get("Content-Encoding") == "gzip" else body.decode()
    assert status == 200 and "/static/app.js" in page and "http://" not in page and "https://" not in page
    script = _get(seeded_dashboard.url + "static/app.js")[2].decode()
    assert "timeChart" in script and "https://" not in script  # no CDN
    charts = _get(seeded_dashboard.url + "static/charts.js")[2].decode()
    assert "function timeChart" in charts and "https://" not in charts and "/static/charts.js" in page
    library = _get(seeded_dashboard.url + "static/uPlot.iife.min.js")[2].decode()
    assert library.startswith("/*! https://github.com/leeoniya/uPlot") and "uPlot.iife.min.js" in page
    assert "MIT License" in _get(seeded_dashboard.url + "static/uPlot.LICENSE.txt")[2].decode()
    assert "default-src 'self'" in headers["Content-Security-Policy"]


def test_post_is_refused_and_keep_alive_works(seeded_dashboard) -> None:
    parts = urllib.parse.urlsplit(seeded_dashboard.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    connection.request("POST", "/api/overview", body=b"{}")
    response = connection.getresponse()
    assert response.status == 405 and "read-only" in json.loads(response.read())["error"]
    connection.request("HEAD", "/healthz")
    response = connection.getresponse()
    assert response.status == 200 and response.read() == b""
    connection.close()


def test_bucket_for_snaps_to_nice_lengths() -> None:
    assert bucket_for(24 * 3600, 288) == 300
    assert bucket_for(3600, 1000) == 5
    assert bucket_for(30, 300) == 1  # 30 s of quick-start telemetry: one point per window, not one 5-minute bucket
    assert bucket_for(90 * 86400, 10) == 9 * 86400  # past the largest nice bucket: exact


def test_unreachable_store_fails_at_start(tmp_path) -> None:
    from edgekit.fleet.dashboard import DashboardServer
    from edgekit.fleet.errors import StoreError

    with pytest.raises(StoreError, match="folder .* does not exist"):
        DashboardServer(f"sqlite:///{tmp_path}/missing/dir/fleet.db", port=0).start()


def test_fleet_series_by_target_and_a_bad_grouping(seeded_dashboard) -> None:
    data = json.loads(_get(seeded_dashboard.url + "api/fleet-series?by=target&hours=6")[2])
    assert set(data["groups"]) == {"jetson-orin-nano-8gb", "jetson-orin-nx-16gb", "raspberry-pi-5"}
    pi = data["groups"]["raspberry-pi-5"]
    assert pi["devices"] == 2 and all(worst >= mean for worst, mean in zip(pi["p99_max_ms"], pi["p99_ms"]))
    modes = json.loads(_get(seeded_dashboard.url + "api/fleet-series?by=power_mode&hours=6")[2])["groups"]
    assert set(modes) == {"15W", "MAXN+clocks", "(not reported)"} and modes["MAXN+clocks"]["devices"] == 2
    table = json.loads(_get(seeded_dashboard.url + "api/devices")[2])
    assert {d["device"]: d["power_mode"] for d in table["devices"]}["jetson-orin-nx-16gb-001"] == "MAXN+clocks"
    assert {d["power_mode"] for d in table["devices"] if d["target"] == "raspberry-pi-5"} == {None}
    assert table["columns"] == {"power_mode": True, "models": False}
    by_mode = json.loads(_get(seeded_dashboard.url + "api/devices?sort=power_mode&order=desc")[2])["devices"]
    assert [d["power_mode"] for d in by_mode] == ["MAXN+clocks"] * 2 + ["15W"] * 2 + [None] * 2
    assert json.loads(_get(seeded_dashboard.url + "api/devices?q=maxn")[2])["total"] == 2  # the power mode is searched
    status, _, body = _get(seeded_dashboard.url + "api/fleet-series?by=colour")
    assert status == 400 and "by must be one of bundle_id, target, power_mode" in json.loads(body)["error"]


NOW = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.timezone.utc)


def test_resolution_follows_the_data(store) -> None:
    """The quick start after 30 s (three 10 s windows a device): one point per window at every range."""
    seed_history(store, devices=3, hours=30 / 3600, window_s=10.0, upgrade_at=None, now=NOW)
    for hours in (0.25, 1, 24, 168):
        data = device_series(store, "sim", "jetson-orin-nano-8gb-000", hours=hours, now=NOW)
        assert data["bucket_s"] == 10 and len(data["series"]["t"]) == 3, hours  # not one 5-minute bucket
    assert fleet_series(store, hours=1, now=NOW)["bucket_s"] == 10  # three devices, still per window


def test_older_telemetry_comes_from_rollups_with_the_worst_p99_kept(store) -> None:
    seed_history(store, devices=1, hours=3, window_s=60.0, upgrade_at=None, now=NOW)  # 3 h of 1-minute windows
    before = device_series(store, "sim", "jetson-orin-nano-8gb-000", hours=3, now=NOW)
    assert store.apply_retention(dt.timedelta(hours=1), rollup_minutes=5, now=NOW) >= 119
    after = device_series(store, "sim", "jetson-orin-nano-8gb-000", hours=3, now=NOW)
    assert before["bucket_s"] == after["bucket_s"] == 60
    steps = [b - a for a, b in zip(after["series"]["t"], after["series"]["t"][1:])]
    assert set(steps[:20]) == {300_000} and set(steps[-50:]) == {60_000}  # rollups back then, raw windows lately
    assert max(after["series"]["p99_max_ms"]) == max(before["series"]["p99_max_ms"])  # the worst p99 survives roll-up


def test_a_20_second_spike_is_the_bucket_maximum(store) -> None:
    spike = seed_spike(store, hours=1.0, window_s=10.0, spike_s=20.0, now=NOW)
    data = device_series(store, spike.fleet, spike.device, hours=1, now=NOW)
    fleet = fleet_series(store, hours=1, now=NOW)
    assert data["bucket_s"] == fleet["bucket_s"] == 30
    assert max(data["series"]["p99_max_ms"]) == spike.p99_ms == max(fleet["groups"]["demo-v1"]["p99_max_ms"])
    assert max(data["series"]["p99_ms"]) < 0.9 * spike.p99_ms  # a bucket mean would flatten it


def test_series_ranges_are_kept_for_their_ttl(tmp_path) -> None:
    from edgekit.fleet.dashboard.api import SeriesRanges
    from edgekit.fleet.store import open_store

    with open_store(f"sqlite:///{tmp_path}/fleet.db") as store:
        seed_history(store, fleet="a", devices=1, hours=30 / 3600, window_s=10.0, upgrade_at=None, now=NOW)
        kept, fresh = SeriesRanges(ttl_s=60.0), SeriesRanges(ttl_s=0.0)
        first = kept(store, hours=24, points=300, now=NOW)
        assert first.bucket_s == 10 and first.since == NOW - dt.timedelta(seconds=30)
        seed_history(store, fleet="b", devices=1, hours=6, window_s=60.0, upgrade_at=None, now=NOW)  # older data arrives
        later = NOW + dt.timedelta(seconds=10)
        assert kept(store, hours=24, points=300, now=later) == type(first)(first.since, later, 10)  # the kept answer
        assert fresh(store, hours=24, points=300, now=later).bucket_s == 120  # 6 h of data: a point per 2 min
        assert kept(store, hours=1, points=300, now=later).bucket_s == 60  # another range: asked anew


def test_the_page_never_shows_the_store_password(postgres_url) -> None:
    from edgekit.fleet.dashboard import DashboardServer

    parts = urllib.parse.urlsplit(postgres_url)
    with_password = urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}:s3cret-pw@{parts.hostname}:{parts.port or 5432}"))
    with DashboardServer(with_password, port=0, cache_s=0.0) as server:  # the test server trusts loopback: any password
        body = _get(server.url + "api/overview")[2].decode()
    assert "s3cret-pw" not in body and f"{parts.username}:***@" in json.loads(body)["store"]


def test_fleet_ranges_from_the_fleet_aggregate_match_the_per_device_ones(store) -> None:
    """The fast path (first window from the per-fleet aggregate, window length from the devices' intervals) finds the
    same bucket and about the same start as reading every device's windows in the range: fleet ``a`` is the quick
    start after 30 s (10 s windows), ``b`` 6 h of 2-minute windows."""
    from edgekit.fleet.dashboard.api import median_interval_s, series_range

    seed_history(store, fleet="a", devices=3, hours=30 / 3600, window_s=10.0, upgrade_at=None, now=NOW)
    seed_history(store, fleet="b", devices=4, hours=6, window_s=120.0, upgrade_at=None, now=NOW)
    for fleet in ("a", "b", None):
        summaries = store.device_summaries(fleet)
        for hours in (0.25, 1, 24, 168):
            slow = series_range(store, hours=hours, points=300, now=NOW, fleet=fleet)
            fast = series_range(store, hours=hours, points=300, now=NOW, fleet=fleet, window_s=lambda: median_interval_s(summaries))
            # the same bucket; the start may differ by the window straddling the range's start (the store's fleet
            # aggregate counts a window in the minute it started, the per-device read by its end)
            assert fast.bucket_s == slow.bucket_s and fast.until == slow.until, (fleet, hours)
            assert abs((fast.since - slow.since).total_seconds()) <= 120.0, (fleet, hours)
    assert series_range(store, hours=1, points=300, now=NOW, fleet="a", window_s=lambda: 10.0).bucket_s == 10


def test_a_fleet_range_with_no_window_started_in_it_needs_no_per_device_read(store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hourly windows whose last one ended 33 minutes ago (none started in the last hour), and a fleet silent for two
    hours: the fast path gives the per-device read's answer without making it (at 10,000 devices on PostgreSQL that
    read took 1.3-1.4 s on every refresh of the 1-hour chart)."""
    from edgekit.fleet.dashboard.api import median_interval_s, series_range

    seed_history(store, fleet="hourly", devices=3, hours=6, window_s=3600.0, upgrade_at=None, now=NOW - dt.timedelta(minutes=33))
    seed_history(store, fleet="silent", devices=2, hours=1, window_s=60.0, upgrade_at=None, now=NOW - dt.timedelta(hours=2))
    groupings: list[tuple[str, ...]] = []
    aggregate = store.aggregate
    monkeypatch.setattr(store, "aggregate", lambda by, **kwargs: groupings.append(tuple(by)) or aggregate(by, **kwargs))
    for fleet in ("hourly", "silent"):
        summaries = store.device_summaries(fleet)
        for hours in (0.25, 1, 24):
            slow = series_range(store, hours=hours, points=300, now=NOW, fleet=fleet)
            groupings.clear()
            fast = series_range(store, hours=hours, points=300, now=NOW, fleet=fleet, window_s=lambda: median_interval_s(summaries))
            assert groupings == [("fleet",)], (fleet, hours)  # the per-fleet aggregate only
            assert fast.bucket_s == slow.bucket_s and fast.until == slow.until, (fleet, hours, fast, slow)
            assert abs((fast.since - slow.since).total_seconds()) <= 3600.0, (fleet, hours)
