"""``edgekit_fleet_model_error_ratio`` is failed inferences over attempted ones: 1 when every inference fails (a
series, so the shipped rule fires), never above 1, and 0 for a healthy model."""

from __future__ import annotations

from pathlib import Path

from edgekit.fleet.metrics import IngestMetrics, MetricsServer
from edgekit.fleet.store import open_store
from edgekit_runtime.agent.telemetry import BundleRef
from tests.fleet.alerts.live_messages import live_window
from tests.fleet.prometheus_text import parse_exposition


def test_the_model_error_ratio_divides_by_every_attempt(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    with open_store(url) as store:
        store.add_windows([
            live_window(1, device="dev-1", bundle=BundleRef("broken", "b" * 64), inferences=0, failed=100, window_s=60),
            live_window(1, device="dev-2", bundle=BundleRef("flaky", "c" * 64), inferences=10, failed=30, window_s=60),
            live_window(1, device="dev-3", bundle=BundleRef("fine", "e" * 64), inferences=100, failed=0, window_s=60),
        ])  # fmt: skip
    server = MetricsServer(IngestMetrics(), 0, store=open_store(url)).start()
    try:
        ratio = parse_exposition(server.render())["edgekit_fleet_model_error_ratio"]
    finally:
        server.stop()
    assert sorted((labels["bundle"], value) for labels, value in ratio.samples) == [("broken", 1.0), ("fine", 0.0), ("flaky", 0.75)]
