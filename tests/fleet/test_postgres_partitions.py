"""PostgreSQL's daily rollup partitions against a device whose clock says 1970 (ingest takes it: a device without
an RTC before NTP). Retention and a device restarting its seqs roll such a window up; the rollup partitions made
for it are those of the days with rows, and one early partition for everything before 2000, never one a day from
1970 (some 20,000 tables in one transaction: PostgreSQL ran out of shared memory after about 25 s, the error was
taken for an outage and every device's batch was retried forever). Real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from edgekit.fleet.errors import StoreError, StoreUnavailableError
from edgekit.fleet.store import FleetStore, open_store
from tests.fleet.messages import window

UTC = dt.timezone.utc
NOW = dt.datetime.now(UTC).replace(microsecond=0)
NO_RTC = dt.datetime(1970, 1, 1, 0, 0, 10, tzinfo=UTC)
#: Far below what creating a partition a day since 1970 took (about 25 s, then a failure).
QUICK_S = 10.0


def _partition_names(store: FleetStore, table: str = "telemetry_rollups") -> list[str]:
    with store._transaction("listing partitions", write=False) as cursor:  # type: ignore[attr-defined]
        cursor.execute("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                       "WHERE i.inhparent = to_regclass(%s) ORDER BY 1", (table,))  # fmt: skip
        return [name for (name,) in cursor.fetchall()]


def _day_partition(moment: dt.datetime) -> str:
    bucket = moment - dt.timedelta(seconds=moment.timestamp() % 300)  # the 5-minute bucket it is rolled into
    return f"telemetry_rollups_p{bucket:%Y%m%d}"


def test_retention_rolls_a_1970_window_into_one_early_partition(postgres_url: str) -> None:
    good = [window(seq, device="good", start=NOW - dt.timedelta(hours=2, seconds=-10 * seq)) for seq in range(1, 4)]
    with open_store(postgres_url) as store:
        assert store.add_windows(good + [window(1, device="no-rtc", start=NO_RTC)]) == 4
        started = time.monotonic()
        assert store.apply_retention(dt.timedelta(hours=1)) == 4
        assert time.monotonic() - started < QUICK_S
        assert list(store.windows()) == []
        assert _partition_names(store) == sorted({"telemetry_rollups_early"} | {_day_partition(w.window_start) for w in good})
        (rolled,) = store.aggregate(("device",), devices=[("lab", "no-rtc")])  # counted in the rollups
        assert rolled.windows == 1
        # rollup retention drops the early partition whole, as it drops old days
        store.apply_retention(dt.timedelta(hours=1), rollups_for=dt.timedelta(days=30))
        assert _partition_names(store) == sorted({_day_partition(w.window_start) for w in good})
        assert store.aggregate(("device",), devices=[("lab", "no-rtc")]) == []


def test_a_device_restarting_its_seqs_after_a_1970_window_stalls_no_ingest(postgres_url: str) -> None:
    with open_store(postgres_url) as store:
        # no RTC yet, then the clock set: both windows still raw
        assert store.add_windows([window(1, device="no-rtc", start=NO_RTC),
                                  window(2, device="no-rtc", start=NOW - dt.timedelta(minutes=5))]) == 2  # fmt: skip
        started = time.monotonic()
        # reflashed: its seqs start again, so the old raw windows are rolled up inside this batch's transaction
        assert store.add_windows([window(1, device="no-rtc", start=NOW - dt.timedelta(minutes=1)),
                                  window(1, device="good", start=NOW - dt.timedelta(seconds=30))]) == 2  # fmt: skip
        assert time.monotonic() - started < QUICK_S
        assert sorted((w.device, w.seq) for w in store.windows()) == [("good", 1), ("no-rtc", 1)]
        assert "telemetry_rollups_early" in _partition_names(store)
        assert len(_partition_names(store)) <= 3  # the early one and the day (or two, around midnight) of the others


def test_a_statement_past_a_postgresql_limit_is_refused_not_retried_as_an_outage(postgres_url: str) -> None:
    """SQLSTATE class 54 (program limit exceeded) fails the same way every time: a StoreError, which the collector
    writes one by one, not a StoreUnavailableError, which it retries forever."""
    with open_store(postgres_url) as store:
        with pytest.raises(StoreError) as raised:
            store._query("testing a limit", "SELECT concat(" + ", ".join(["'a'"] * 101) + ")")  # type: ignore[attr-defined]
        assert not isinstance(raised.value, StoreUnavailableError)
        assert "cannot pass more than 100 arguments" in raised.value.message


def test_a_clock_giving_another_day_each_window_makes_no_table_a_window(postgres_url: str) -> None:
    """A broken RTC: every window on another day between 2000 and six weeks ago. They share one default partition
    (before, each made a daily partition); the rollup retention trims them from it by DELETE."""
    import random

    six_weeks_ago = int((NOW - dt.datetime(1970, 1, 1, tzinfo=UTC)).days) - 42
    days = random.Random(5).sample(range(11_000, six_weeks_ago), 60)  # days since 1970: from 2000-02 on
    broken = [window(seq, device="broken", start=dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(days=day, hours=3))
              for seq, day in enumerate(days, start=1)]  # fmt: skip
    offline = [window(1, device="offline", start=NOW - dt.timedelta(days=20))]  # a backlog from three weeks ago
    recent = [window(seq, device="good", start=NOW - dt.timedelta(hours=2, seconds=-10 * seq)) for seq in range(1, 4)]
    with open_store(postgres_url) as store:
        assert store.add_windows(broken + offline + recent) == 64
        assert store.apply_retention(dt.timedelta(hours=1)) == 64
        names = _partition_names(store)
        assert "telemetry_rollups_default" in names and len(names) <= 3, names  # default + today's (or two around midnight)
        assert [r.windows for r in store.aggregate(("device",), devices=[("lab", "broken"), ("lab", "offline")])] == [60, 1]
        store.apply_retention(dt.timedelta(hours=1), rollups_for=dt.timedelta(days=30))
        assert [r.windows for r in store.aggregate(("device",), devices=[("lab", "broken"), ("lab", "offline")])] == [1]
        assert store.aggregate(("device",), devices=[("lab", "broken")]) == []
        assert "telemetry_rollups_default" in _partition_names(store)


def test_a_day_coming_into_range_takes_its_rows_from_the_default_partition(postgres_url: str) -> None:
    """Buckets of a day outside the range wait in the default partition; when the collector makes that day's
    partition (as when a device's clock ran ahead and the day came), the day's rows move into it: PostgreSQL refuses
    the partition while the default partition holds rows of its range."""
    from edgekit.fleet.store import partitions

    old = NOW - dt.timedelta(days=20)
    with open_store(postgres_url) as store:
        store.add_windows([window(1, device="late", start=old)])
        store.apply_retention(dt.timedelta(hours=1))
        with store._transaction("making the day's partition") as cursor:  # type: ignore[attr-defined]
            cursor.execute("SELECT count(*) FROM telemetry_rollups_default")
            assert cursor.fetchone()[0] == 1
            partitions.ensure_partitions(cursor, "telemetry_rollups", [old], now=old)
            cursor.execute("SELECT count(*) FROM telemetry_rollups_default")
            assert cursor.fetchone()[0] == 0
            cursor.execute("SELECT tableoid::regclass::text, count(*) FROM telemetry_rollups WHERE device = 'late' GROUP BY 1")
            assert cursor.fetchall() == [(_day_partition(old), 1)]
        (rolled,) = store.aggregate(("device",), devices=[("lab", "late")])
        assert rolled.windows == 1
