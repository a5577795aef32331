"""The device table read in SQL (edgekit/fleet/store/device_reads.py) against the same table made in Python from
``device_summaries``: liveness, counts, every sort in both orders, filters, search, breaching devices and paging give
the same rows on SQLite and on PostgreSQL, for a fleet whose devices are online, stale, offline, unknown and
``updating``, with and without a power mode, with and without telemetry."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest

from edgekit.fleet.dashboard.api import bundle_rows, median_interval_s, state_counts
from edgekit.fleet.dashboard.device_table import SORTS, DeviceQuery, DeviceTable
from edgekit.fleet.liveness import worst_first
from edgekit.fleet.sim.seed import seed_history
from edgekit.fleet.store import FleetStore, open_store
from edgekit.fleet.store.base import DeviceIdentityRecord, DeviceStatus
from edgekit.fleet.store.device_reads import STATUS_RANKS

NOW = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


def _seed(store: FleetStore) -> None:
    seed_history(store, fleet="a", devices=12, hours=0.5, window_s=60.0, now=NOW)
    seed_history(store, fleet="b", devices=3, hours=0.5, window_s=60.0, now=NOW - dt.timedelta(minutes=5))  # stale
    seed_history(store, fleet="c", devices=2, hours=0.5, window_s=60.0, now=NOW - dt.timedelta(hours=2))  # offline
    store.set_device_target("d", "ghost-1", "raspberry-pi-5")  # unknown: never reported
    store.upsert_status(DeviceStatus("a", "jetson-orin-nano-8gb-000", "updating", "demo-v2", "jetson-orin-nano-8gb", "sim-1", NOW))
    identity = DeviceIdentityRecord("a", "jetson-orin-nx-16gb-001", board="jetson-orin-nx-16gb", soc=None, os=None, l4t=None,
                                    jetpack=None, cuda=None, tensorrt=None, onnxruntime=None, power_mode="MAXN",
                                    clocks_locked=False, updated_at=NOW)  # fmt: skip
    store.upsert_status(DeviceStatus("a", "jetson-orin-nx-16gb-001", "online", "demo-v2", "jetson-orin-nx-16gb", "sim-1",
                                     NOW, identity=identity))  # fmt: skip
    store.upsert_status(DeviceStatus("b", "raspberry-pi-5-002", "offline", "demo-v2", "raspberry-pi-5", "sim-1", NOW))  # a will


@pytest.fixture
def seeded(store_url: str):
    # The Python path (device_summaries) judges liveness against the clock; the store's reads take ``now``. NOW is
    # taken again for each seeding so that the two agree however long after collection a test runs (a full suite
    # reached these tests 15 minutes in, by when every device seeded at collection time had gone stale).
    global NOW
    NOW = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    with open_store(store_url) as store:
        _seed(store)
        yield store


def _keys(page: dict) -> list[tuple[str, str, str]]:
    return [(row["fleet"], row["device"], row["state"]) for row in page["devices"]]


def test_counts_and_the_median_interval_match_the_summaries(seeded: FleetStore) -> None:
    summaries = seeded.device_summaries()
    counts = seeded.device_counts(now=NOW)  # type: ignore[attr-defined]
    assert counts.devices == len(summaries) == 18
    assert counts.states == state_counts(summaries) == {"online": 11, "stale": 2, "offline": 3, "unknown": 1, "updating": 1}
    assert sorted(counts.bundles, key=lambda b: str(b["bundle_id"])) == sorted(bundle_rows(summaries), key=lambda b: str(b["bundle_id"]))
    assert [b["devices"] for b in counts.bundles] == sorted((b["devices"] for b in counts.bundles), reverse=True)
    assert seeded.median_interval_s() == median_interval_s(summaries) == 60.0  # type: ignore[attr-defined]
    assert seeded.device_counts("c", now=NOW).states == {"online": 0, "stale": 0, "offline": 2, "unknown": 0}  # type: ignore[attr-defined]


def test_every_page_the_store_cuts_is_the_page_python_cuts(seeded: FleetStore) -> None:
    summaries = seeded.device_summaries()
    breaching = frozenset({("a", "raspberry-pi-5-002"), ("b", "jetson-orin-nx-16gb-001")})
    table = DeviceTable(seeded, breaching=lambda fleet: breaching)
    compared = 0
    for sort, order, (offset, limit) in itertools.product(SORTS, ("asc", "desc"), ((0, 100), (3, 5))):
        query = DeviceQuery(sort=sort, order=order, offset=offset, limit=limit)
        in_store, in_python = table.page(query, now=NOW), table.page(query, summaries, now=NOW)
        assert in_store == in_python, (sort, order, offset)
        compared += len(in_store["devices"])
    assert compared == len(SORTS) * 2 * (18 + 5)
    worst = table.page(DeviceQuery(), now=NOW)
    assert [row["state"] for row in worst["devices"]][:5] == ["offline"] * 3 + ["stale"] * 2
    assert [row["breaching"] for row in worst["devices"] if row["state"] == "online"][:1] == [True]  # breaching first


@pytest.mark.parametrize("params", [
    {"q": "RASPBERRY"}, {"q": "maxn"}, {"q": "demo-v1"}, {"q": "upd"}, {"q": "100%_"}, {"state": "offline,stale"},
    {"state": "updating"}, {"fleet": "b", "sort": "p99_ms", "order": "desc"}, {"fleet": "d"}, {"q": "nano", "state": "online"},
])  # fmt: skip
def test_filters_and_search_match_python(seeded: FleetStore, params: dict[str, str]) -> None:
    query = DeviceQuery.from_params(params)
    table = DeviceTable(seeded)
    in_store = table.page(query, now=NOW)
    in_python = table.page(query, seeded.device_summaries(query.fleet), now=NOW)
    assert in_store == in_python, params
    assert in_store["fleet_devices"] == len(seeded.device_summaries(query.fleet))


def test_fleet_status_order_is_worst_first(seeded: FleetStore) -> None:
    summaries = seeded.device_summaries()
    page = seeded.device_page(worst_ranks=STATUS_RANKS, limit=None, now=NOW)  # type: ignore[attr-defined]
    assert page.devices == sorted(summaries, key=lambda s: worst_first(s.state, s.p99_ms))
    assert page.total == page.fleet_devices == 18
    stale = seeded.device_page(states=["stale"], worst_ranks=STATUS_RANKS, limit=1, now=NOW)  # type: ignore[attr-defined]
    assert (len(stale.devices), stale.total, stale.fleet_devices) == (1, 2, 18)
    counts = seeded.device_counts(now=NOW)  # type: ignore[attr-defined]
    assert counts.fleets() == ["a", "b", "c", "d"] and counts.fleets(["offline"]) == ["b", "c"]


def test_the_report_counts_states_per_target_as_the_summaries_do(seeded: FleetStore) -> None:
    from edgekit.fleet.liveness import state_counts as liveness_counts
    from edgekit.fleet.report import build_report

    summaries = seeded.device_summaries()
    for target in ("raspberry-pi-5", "jetson-orin-nx-16gb", "no-such-target"):
        expected = liveness_counts([s.state for s in summaries if s.target == target])
        assert build_report(seeded, target=target).device_states == expected, target
    assert build_report(seeded).device_states == liveness_counts([s.state for s in summaries])


def test_every_device_row_is_what_the_summary_says(seeded: FleetStore) -> None:
    from edgekit.fleet.report import summary_to_json
    from edgekit.fleet.store.device_reads import DEVICE_ROW_FIELDS

    summaries = seeded.device_summaries()
    rows = [dict(zip(DEVICE_ROW_FIELDS, row)) for row in seeded.device_rows(now=NOW)]  # type: ignore[attr-defined]
    assert rows == [summary_to_json(s) for s in summaries] and len(rows) == 18
    stale = [dict(zip(DEVICE_ROW_FIELDS, row)) for row in seeded.device_rows("b", states=["stale"], now=NOW)]  # type: ignore[attr-defined]
    assert stale == [summary_to_json(s) for s in seeded.device_summaries("b") if s.state == "stale"] and len(stale) == 2
