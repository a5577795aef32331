"""A background FleetReader whose refresher stopped (no scrape for ``idle_s``) reads the store again on the next
scrape instead of serving figures from before the pause (a Prometheus scraping less often than ``idle_s``)."""

from __future__ import annotations

import time
from pathlib import Path

from edgekit.fleet.metrics_fleet import FleetReader
from edgekit.fleet.store import open_store
from tests.fleet.alerts.live_messages import live_window


def test_the_first_scrape_after_a_pause_reads_the_store(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 'fleet.db'}") as store:
        store.add_windows([live_window(1, device="dev-1")])
        reader = FleetReader(store, max_age_s=0.2, background=True, idle_s=0.5)
        try:
            first = reader.snapshot()
            time.sleep(0.3)
            assert reader.snapshot() is not None  # old: a refresher now reads every max_age_s while scrapes come
            time.sleep(1.5)  # no scrape for longer than idle_s: the refresher stops
            reads = reader.reads
            store.add_windows([live_window(1, device=f"dev-{index}") for index in range(2, 12)])
            time.sleep(0.5)
            assert reader.reads == reads  # nothing read since
            after_pause = reader.snapshot()
            assert after_pause is not None and after_pause is not first
            assert (len(after_pause.summaries), reader.reads) == (11, reads + 1)
            assert reader.age_s(after_pause) < 0.2
        finally:
            reader.close()
