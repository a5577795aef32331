"""The fleet store contract, run against SQLite and a real PostgreSQL (the ``store`` fixture is parametrised)."""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from edgekit.fleet.errors import StoreError
from edgekit.fleet.store import FleetStore, RejectedMessage, open_store
from edgekit.fleet.store import sql as sql_store
from edgekit.fleet.store.base import DeviceEvent, DeviceStatus
from edgekit.fleet.store.migrate import latest_version
from edgekit.fleet.ingest import parse_message
from edgekit_runtime.agent.telemetry import encode_message
from tests.fleet.messages import BUNDLE_A, BUNDLE_B, T0, WINDOW_S, event, status, topic, window

MINUTE = dt.timedelta(minutes=1)


def test_windows_are_stored_once_and_read_back_in_seq_order(store: FleetStore) -> None:
    arriving = [window(seq) for seq in (5, 1, 3, 2, 5, 1)]  # out of order, with QoS 1 redeliveries
    assert store.add_windows(arriving) == 4
    assert store.add_windows([window(3), window(2)]) == 0
    stored = list(store.windows())
    assert [w.seq for w in stored] == [1, 2, 3, 5]
    assert stored[0] == window(1)  # every field survives the round trip, times to the microsecond
    assert stored[0].payload == window(1).payload
    assert store.missing_seqs("lab", "dev-1") == [(4, 4)]
    (summary,) = store.device_summaries()
    assert (summary.windows, summary.missing_seqs, summary.bundle_id) == (4, 1, BUNDLE_A.id)


def test_gaps_are_reported_as_ranges(store: FleetStore) -> None:
    store.add_windows([window(seq) for seq in (1, 2, 6, 7, 9, 20)])
    assert store.missing_seqs("lab", "dev-1") == [(3, 5), (8, 8), (10, 19)]
    assert store.missing_seqs("lab", "nobody") == []
    assert store.device_summaries()[0].missing_seqs == 14


def test_windows_filter_and_page(store: FleetStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sql_store, "PAGE_ROWS", 3)
    store.add_windows([window(seq, device=device, bundle=BUNDLE_A if seq <= 4 else BUNDLE_B)
                       for device in ("dev-1", "dev-2") for seq in range(1, 9)])  # fmt: skip
    assert [(w.device, w.seq) for w in store.windows()] == [(d, s) for d in ("dev-1", "dev-2") for s in range(1, 9)]
    assert [w.seq for w in store.windows(device="dev-2", bundle_id=BUNDLE_B.id)] == [5, 6, 7, 8]
    since, until = T0 + 3 * dt.timedelta(seconds=WINDOW_S), T0 + 6 * dt.timedelta(seconds=WINDOW_S)
    assert [w.seq for w in store.windows(device="dev-1", since=since, until=until)] == [3, 4, 5]  # by window end
    assert [(w.device, w.seq) for w in store.windows(limit=10)][-1] == ("dev-2", 2)
    assert list(store.windows(fleet="other")) == []


def test_status_follows_the_latest_message_and_the_will(store: FleetStore) -> None:
    at = T0 + dt.timedelta(hours=1)
    online = DeviceStatus("lab", "dev-1", "online", BUNDLE_A.id, None, "0.1.0", at, status("online"))
    will = DeviceStatus("lab", "dev-1", "offline", None, None, "0.1.0", at + MINUTE, status("offline"))
    store.upsert_status(online)
    assert store.device_summaries()[0].state == "online"
    store.upsert_status(will)
    store.upsert_status(online)  # a lagging collector writing an older message must not win
    (summary,) = store.device_summaries()
    assert (summary.state, summary.last_seen, summary.windows, summary.p50_ms) == ("offline", at + MINUTE, 0, None)
    store.upsert_status(DeviceStatus("lab", "dev-1", "online", BUNDLE_B.id, "orin-nano", "0.1.0", at + 2 * MINUTE))
    (summary,) = store.device_summaries()
    assert (summary.state, summary.bundle_id, summary.target) == ("online", BUNDLE_B.id, "orin-nano")


def test_statuses_in_one_call_apply_in_order_like_one_by_one(store: FleetStore) -> None:
    at = T0 + dt.timedelta(hours=1)
    online = DeviceStatus("lab", "dev-1", "online", BUNDLE_A.id, None, "0.1.0", at, status("online"))
    will = DeviceStatus("lab", "dev-1", "offline", None, None, "0.1.0", at + MINUTE, status("offline"))
    other = DeviceStatus("lab", "dev-2", "online", BUNDLE_B.id, "orin-nano", "0.1.0", at, status("online", device="dev-2"))
    store.upsert_statuses([online, other, will, online])  # the lagging online (older) does not undo the will
    store.upsert_statuses([])
    assert [(s.device, s.state, s.target) for s in store.device_summaries()] == [("dev-1", "offline", None),
                                                                                 ("dev-2", "online", "orin-nano")]


def test_summaries_combine_status_windows_and_targets(store: FleetStore) -> None:
    store.add_windows([window(1, device="dev-1", latencies_ms=[1.0] * 10, power_mw=3000.0, temperature_c=40.0),
                       window(2, device="dev-1", latencies_ms=[5.0] * 10, power_mw=6000.0, temperature_c=70.0),
                       window(1, device="dev-2", fleet="other")])  # fmt: skip
    store.set_device_target("lab", "dev-1", "jetson-orin-nano")
    store.upsert_status(DeviceStatus("lab", "dev-3", "offline", None, None, "0.1.0", T0))
    summaries = {s.device: s for s in store.device_summaries("lab")}
    assert sorted(summaries) == ["dev-1", "dev-3"]
    newest = summaries["dev-1"]
    assert (newest.p50_ms, newest.p99_ms, newest.temperature_max_c) == (5.0, 5.0, 70.0)  # the newest window
    assert newest.power_mean_mw == pytest.approx(6000.0)
    assert newest.energy_per_inference_mj == pytest.approx(6000.0 * WINDOW_S / 10)
    # no status, and its newest window is months old: silent for far more than 10 intervals (edgekit.fleet.liveness)
    assert (newest.target, newest.state, newest.interval_s) == ("jetson-orin-nano", "offline", WINDOW_S)
    assert newest.last_seen == T0 + dt.timedelta(seconds=2 * WINDOW_S)  # the newest window's arrival
    assert summaries["dev-3"].windows == 0 and summaries["dev-3"].state == "offline"


def test_events_are_deduplicated_on_event_id_and_newest_first(store: FleetStore) -> None:
    first = event("deploy_result", at=T0, command_id="c-1")
    second = event("pong", at=T0 + MINUTE, device="dev-2")
    records = [parse_message(topic("events", device=m["device"]), encode_message(m)) for m in (first, second, first)]
    assert all(isinstance(r, DeviceEvent) for r in records)
    assert store.add_events(records) == 2  # type: ignore[arg-type]
    assert store.add_events(records[:1]) == 0  # type: ignore[arg-type]
    assert [e.kind for e in store.events()] == ["pong", "deploy_result"]
    assert [e.event_id for e in store.events(device="dev-1")] == [first["event_id"]]
    assert store.events(since=T0 + MINUTE)[0].payload == second
    assert store.events(limit=1)[0].kind == "pong"


def test_rejected_counts_survive_retention(store: FleetStore) -> None:
    old, new = T0, T0 + dt.timedelta(days=3)
    store.add_rejected([RejectedMessage("edgekit/v1/lab/x/telemetry", "malformed_json", 3, old, "Expecting value"),
                        RejectedMessage("edgekit/v1/lab/x/telemetry", "oversized", 300_000, new)])  # fmt: skip
    store.add_rejected([RejectedMessage("edgekit/v1/lab/x/status", "malformed_json", 5, new)])
    assert store.rejected_counts() == {"malformed_json": 2, "oversized": 1}
    store.apply_retention(dt.timedelta(days=1), now=new)
    assert store.rejected_counts() == {"malformed_json": 2, "oversized": 1}


def _three_devices(store: FleetStore) -> None:
    """dev-1 (nano) and dev-2 (agx) on bundle A then B; dev-3 (nano) on A only. 30 windows each (5 minutes).
    Targets first: fleet aggregates group windows by the target known when they arrive (agents report theirs in the
    status they publish on connecting, before any telemetry)."""
    for device, target in (("dev-1", "nano"), ("dev-2", "agx"), ("dev-3", "nano")):
        store.set_device_target("lab", device, target)
    windows = []
    for device, switch_at in (("dev-1", 16), ("dev-2", 11), ("dev-3", None)):
        for seq in range(1, 31):
            on_b = switch_at is not None and seq >= switch_at
            latencies = [2.0, 2.5 + seq % 2] * 4 if on_b else [1.0 + seq % 4, 3.0 + seq / 10, 6.0 + seq % 5][: 2 + seq % 2]
            windows.append(window(seq, device=device, bundle=BUNDLE_B if on_b else BUNDLE_A, latencies_ms=latencies,
                                  power_mw=4000.0 if on_b else 5000.0 + 100 * seq, temperature_c=40.0 + seq))  # fmt: skip
    store.add_windows(windows)


def _expected(store: FleetStore, **filters: object) -> dict[str, float]:
    """Figures computed in Python from the raw windows, the way the store's SQL must compute them."""
    rows = [w for w in store.windows() if all(getattr(w, k) == v for k, v in filters.items())]
    counted = [w for w in rows if w.p50_ms is not None]
    seconds = [(w.window_end - w.window_start).total_seconds() for w in rows]
    return {
        "windows": len(rows), "inferences": sum(w.count for w in rows),
        "p50_ms": sum(w.p50_ms * w.count for w in counted) / sum(w.count for w in counted),  # type: ignore[operator]
        "p99_ms": sum(w.p99_ms * w.count for w in counted) / sum(w.count for w in counted),  # type: ignore[operator]
        "p99_max_ms": max(w.p99_ms for w in counted),  # type: ignore[type-var]
        "power_mean_mw": sum(w.power_mean_mw * s for w, s in zip(rows, seconds)) / sum(seconds),  # type: ignore[operator]
        "energy_mj": sum(w.energy_mj for w in rows),  # type: ignore[misc]
        "energy_per_inference_mj": sum(w.energy_mj for w in rows) / sum(w.count for w in rows),  # type: ignore[misc]
        "temperature_max_c": max(w.temperature_max_c for w in rows),  # type: ignore[type-var]
    }  # fmt: skip


def _figures(aggregate: object) -> dict[str, float]:
    return {name: getattr(aggregate, name) for name in ("windows", "inferences", "p50_ms", "p99_ms", "p99_max_ms",
                                                         "power_mean_mw", "energy_mj", "energy_per_inference_mj",
                                                         "temperature_max_c")}  # fmt: skip


def test_aggregates_by_bundle_and_target_weight_by_inferences_and_time(store: FleetStore) -> None:
    _three_devices(store)
    groups = {(a.bundle_id, a.target): a for a in store.aggregate()}
    assert sorted(groups, key=str) == sorted([(BUNDLE_A.id, "agx"), (BUNDLE_A.id, "nano"), (BUNDLE_B.id, "agx"),
                                              (BUNDLE_B.id, "nano")], key=str)  # fmt: skip
    assert groups[(BUNDLE_A.id, "nano")].devices == 2 and groups[(BUNDLE_B.id, "agx")].devices == 1
    (only_b,) = store.aggregate(("bundle_id",), bundle_id=BUNDLE_B.id)
    assert _figures(only_b) == pytest.approx(_expected(store, bundle_id=BUNDLE_B.id))
    (dev_3,) = store.aggregate(("device",), devices=[("lab", "dev-3")])
    assert _figures(dev_3) == pytest.approx(_expected(store, device="dev-3"))
    (nano_a,) = store.aggregate((), target="nano", bundle_id=BUNDLE_A.id)
    assert nano_a.devices == 2 and nano_a.windows == 15 + 30
    assert store.aggregate(devices=[]) == [] and store.aggregate(fleet="other") == []


def test_aggregate_time_buckets(store: FleetStore) -> None:
    _three_devices(store)
    buckets = store.aggregate(("device",), devices=[("lab", "dev-3")], bucket_s=60)
    assert [b.bucket_start for b in buckets] == [T0 + i * MINUTE for i in range(5)]
    assert [b.windows for b in buckets] == [6] * 5
    assert sum(b.inferences for b in buckets) == _expected(store, device="dev-3")["inferences"]
    since = T0 + 2 * MINUTE
    # fleet-wide reads come from the minute aggregates: a bucket (of window starts) is in a range when it starts in it
    assert [(b.bucket_start, b.windows) for b in store.aggregate((), since=since, until=since + MINUTE, bucket_s=60)] \
        == [(since, 18)]  # fmt: skip
    # one device's reads still filter raw windows by their end
    assert [(b.bucket_start, b.windows) for b in store.aggregate((), devices=[("lab", "dev-3")], since=since,
                                                                   until=since + MINUTE, bucket_s=60)] \
        == [(T0 + MINUTE, 1), (since, 5)]  # fmt: skip


def test_fleet_aggregates_group_by_the_target_known_when_a_window_arrived(store: FleetStore) -> None:
    store.add_windows([window(1, device="dev-1")])
    store.set_device_target("lab", "dev-1", "nano")
    store.add_windows([window(2, device="dev-1")])
    assert {a.target: a.windows for a in store.aggregate(("target",))} == {None: 1, "nano": 1}


def test_bad_aggregate_requests_name_the_problem(store: FleetStore) -> None:
    with pytest.raises(StoreError, match=r"cannot aggregate by \['colour'\]"):
        store.aggregate(("colour",))
    with pytest.raises(StoreError, match="bucket_s must be a whole number of seconds >= 1, got 0"):
        store.aggregate((), bucket_s=0)


def test_bundle_spans_show_when_each_device_switched(store: FleetStore) -> None:
    _three_devices(store)
    spans = store.bundle_spans()
    assert [(s.device, s.bundle_id, s.windows) for s in spans] == [
        ("dev-1", BUNDLE_A.id, 15), ("dev-1", BUNDLE_B.id, 15), ("dev-2", BUNDLE_A.id, 10), ("dev-2", BUNDLE_B.id, 20),
        ("dev-3", BUNDLE_A.id, 30)]  # fmt: skip
    assert spans[1].first_window_start == T0 + 15 * dt.timedelta(seconds=WINDOW_S)


def test_retention_rolls_old_windows_into_buckets_without_changing_the_totals(store: FleetStore) -> None:
    _three_devices(store)
    before = {(a.bundle_id, a.target): _figures(a) for a in store.aggregate()}
    summaries_before = store.device_summaries()
    now = T0 + 3 * MINUTE + dt.timedelta(hours=1)  # windows ending before T0 + 3 min are past 1 h of raw retention
    rolled = store.apply_retention(dt.timedelta(hours=1), rollup_minutes=1, now=now)
    assert rolled == 3 * 17  # seq 1..17 end by T0 + 170 s (< 180 s); seq 18 ends exactly at the cutoff
    assert [w.seq for w in store.windows(device="dev-3")] == list(range(18, 31))
    after = {(a.bundle_id, a.target): _figures(a) for a in store.aggregate()}
    assert after.keys() == before.keys()
    for key in before:
        assert after[key] == pytest.approx(before[key]), key
    assert [(s.device, s.windows, s.missing_seqs) for s in store.device_summaries()] == \
        [(s.device, s.windows, s.missing_seqs) for s in summaries_before]  # fmt: skip
    assert [b.windows for b in store.aggregate(("device",), devices=[("lab", "dev-3")], bucket_s=60)] == [6] * 5
    # A late window for an already rolled-up bucket merges into it on the next pass.
    store.add_windows([window(31, device="dev-3", start=T0 + dt.timedelta(seconds=5))])
    assert store.apply_retention(dt.timedelta(hours=1), rollup_minutes=1, now=now) == 1
    (dev_3,) = store.aggregate(("device",), devices=[("lab", "dev-3")])
    assert dev_3.windows == 31
    assert store.apply_retention(dt.timedelta(0), rollup_minutes=1, now=now) == 90 - 51
    assert list(store.windows()) == []
    expected = {key: figures["windows"] for key, figures in before.items()}
    expected[(BUNDLE_A.id, "nano")] += 1  # the late window
    assert {(a.bundle_id, a.target): a.windows for a in store.aggregate()} == expected


def test_retention_arguments_are_checked(store: FleetStore) -> None:
    with pytest.raises(StoreError, match="retention time must be a non-negative timedelta, got 5"):
        store.apply_retention(5)  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="rollup_minutes must be a whole number >= 1, got 0"):
        store.apply_retention(dt.timedelta(hours=1), rollup_minutes=0)


def test_two_writers_store_each_window_once(store_url: str) -> None:
    """Two collectors' store connections inserting overlapping windows at once."""
    windows = [window(seq, device=f"dev-{seq % 5}") for seq in range(1, 301)]
    new_counts: list[int] = []
    stores = [open_store(store_url), open_store(store_url)]

    def write(target: FleetStore, offset: int) -> None:
        batch = windows[offset:] + windows[:offset]
        new_counts.append(sum(target.add_windows(batch[i:i + 50]) for i in range(0, len(batch), 50)))

    threads = [threading.Thread(target=write, args=(s, i * 150)) for i, s in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sum(new_counts) == 300
    assert len(list(stores[0].windows())) == 300
    for opened in stores:
        opened.close()


def test_schema_is_migrated_once_and_a_newer_schema_is_refused(store_url: str) -> None:
    with open_store(store_url) as first:
        assert first.schema_version == latest_version(first.dialect)  # type: ignore[attr-defined]
        first.add_windows([window(1)])
    with open_store(store_url) as again:  # reopening applies nothing and keeps the data
        assert [w.seq for w in again.windows()] == [1]
        with again._transaction("test") as cursor:  # type: ignore[attr-defined]
            insert = "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)"
            cursor.execute(again._sql(insert), (99, "from_the_future", "2030-01-01"))  # type: ignore[attr-defined]
    with pytest.raises(StoreError, match=r"has schema version 99, newer than the \d+ this edgekit knows") as info:
        open_store(store_url)
    assert "upgrade edgekit" in (info.value.hint or "")


def test_a_closed_store_says_so(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    store.close()
    with pytest.raises(StoreError, match="is closed"):
        store.rejected_counts()


@pytest.mark.parametrize(("url", "problem"), [
    ("fleet.db", "it has no scheme:// part"),
    ("mysql://db/fleet", "scheme 'mysql' is not one of postgres, postgresql, sqlite"),
    ("sqlite://fleet.db", "a SQLite URL has three slashes and a path after them"),
    ("sqlite:///", "a SQLite URL has three slashes and a path after them"),
])  # fmt: skip
def test_bad_store_urls_name_the_url_and_the_accepted_forms(url: str, problem: str) -> None:
    with pytest.raises(StoreError) as info:
        open_store(url)
    assert info.value.message == f"fleet store URL {url!r} is not usable: {problem}"
    assert "sqlite:///PATH.db, sqlite:///:memory:, postgresql://USER@HOST:PORT/DATABASE" in (info.value.hint or "")


def test_sqlite_paths_are_checked(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(StoreError, match=f"folder {tmp_path / 'missing'} does not exist"):
        open_store(f"sqlite:///{tmp_path / 'missing' / 'fleet.db'}")
    with pytest.raises(StoreError, match=r"does not exist \(no file .*absent.db\)") as info:
        open_store(f"sqlite:///{tmp_path / 'absent.db'}", must_exist=True)
    assert "edgekit fleet collect" in (info.value.hint or "")
    assert not (tmp_path / "absent.db").exists()
    with open_store("sqlite:///:memory:") as memory:
        assert memory.add_windows([window(1)]) == 1 and memory.url == "sqlite:///:memory:"


def test_unreachable_postgres_is_reported_without_the_password() -> None:
    from edgekit.fleet.errors import StoreUnavailableError
    from tests.runtime.agent.mosquitto import free_port

    pytest.importorskip("psycopg")
    url = f"postgresql://fleet:s3cret@127.0.0.1:{free_port()}/fleet"
    with pytest.raises(StoreUnavailableError) as info:
        open_store(url)
    assert info.value.message.startswith(f"cannot connect to fleet store postgresql://fleet:***@127.0.0.1:")
    assert "s3cret" not in str(info.value) and "postgresql://user@host:5432/dbname" in (info.value.hint or "")


def test_a_lost_postgres_connection_is_reopened(postgres_url: str) -> None:
    import psycopg

    from edgekit.fleet.errors import StoreUnavailableError

    url = postgres_url + "&application_name=edgekit-reopen-test"
    with open_store(url) as store:
        store.add_windows([window(1)])
        with psycopg.connect(url.split("?")[0], autocommit=True) as admin:  # the server drops the connection
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE application_name = 'edgekit-reopen-test'")  # fmt: skip
        with pytest.raises(StoreUnavailableError, match="failed while storing 1 telemetry windows") as info:
            store.add_windows([window(2)])
        assert "retried" in (info.value.hint or "")
        assert store.add_windows([window(2)]) == 1  # the next call connects again
        assert [w.seq for w in store.windows()] == [1, 2]
