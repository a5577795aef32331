"""A store for the operator's-day dashboard tests and screenshots (issue 32): a fleet of cameras serving models
(long bundle ids, so the device table is at its widest), one without a power sensor, one idle, one identity
reported, events of several devices, and five rollouts in 15 minutes, the newest in progress."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

from edgekit_runtime.agent.telemetry import BundleRef, encode_message

from edgekit.fleet.ingest import parse_message
from edgekit.fleet.store import TelemetryWindow, open_store
from edgekit.fleet.store.base import DeviceEvent, DeviceIdentityRecord, DeviceStatus
from tests.fleet.messages import telemetry
from tests.fleet.model_messages import model_entry, model_telemetry

FLEET = "lab"
BUNDLE = BundleRef(id="digits-cnn-x86-64-cpu-fp32-88d81029cc3c", sha256="d" * 64)
TARGET = "jetson-orin-nano-8gb"
CAMERAS = ("cam-entrance-north-01", "cam-loading-dock-02", "cam-warehouse-aisle-03")
NO_POWER = "cam-loading-dock-02"
IDLE = "kiosk-idle-04"
MINUTES = 20


def _parsed(message: dict[str, Any]) -> TelemetryWindow:
    record = parse_message(f"edgekit/v1/{message['fleet']}/{message['device']}/telemetry", encode_message(message),
                           received_at=dt.datetime.fromisoformat(message["window"]["end"]))  # fmt: skip
    assert isinstance(record, TelemetryWindow)
    return record


def _without_power(window: TelemetryWindow) -> TelemetryWindow:
    """The window as an agent without a power sensor sends it (NO_POWER's): telemetry, but no power readings."""
    if window.device != NO_POWER:
        return window
    return replace(window, power_mean_mw=None, power_max_mw=None, energy_mj=None, energy_per_inference_mj=None)


def _rollout(index: int, started: dt.datetime, devices: tuple[str, ...], state: str, **extra: Any) -> Any:
    from edgekit.fleet.rollout_state import RolloutRecord

    outcomes = {d: "succeeded" for d in devices} if state == "completed" else extra.pop("outcomes")
    return RolloutRecord(f"r{index}", FLEET, f"digits-cnn-v{index}-88d81029cc3{index}", "file:///b.tar", "0" * 64, state,
                         devices[:1], devices, started, started + dt.timedelta(seconds=70),
                         finished_at=None if state == "watching" else started + dt.timedelta(seconds=70),
                         outcomes=outcomes, **extra)  # fmt: skip


def seed_operator_store(path: str, now: dt.datetime | None = None) -> str:
    """Write the store at ``path`` (a file); returns its URL."""
    from edgekit.fleet.rollout_state import open_rollout_log

    url = f"sqlite:///{path}"
    now = (now or dt.datetime.now(dt.timezone.utc)).replace(microsecond=0)
    start = now - dt.timedelta(minutes=MINUTES)
    windows = []
    for device in CAMERAS:
        for seq in range(1, MINUTES * 6 + 1):
            entries = [model_entry("detector", "yolo-int8-1", [9.0, 10.0, 11.0, 12.0]), model_entry("classifier", "mobilenet-2", [2.0] * 2)]
            window = _parsed(model_telemetry(seq, entries, device=device, fleet=FLEET, start=start + dt.timedelta(seconds=10 * seq)))
            windows.append(_without_power(window))
    for seq in range(1, MINUTES * 6 + 1):  # the kiosk's newest window had no inference
        latencies = () if seq == MINUTES * 6 else (3.0, 3.5, 4.0)
        windows.append(_parsed(telemetry(seq, device=IDLE, fleet=FLEET, bundle=BUNDLE, latencies_ms=latencies,
                                         start=start + dt.timedelta(seconds=10 * seq))))  # fmt: skip
    first = CAMERAS[0]
    with open_store(url) as store:
        for device in CAMERAS + (IDLE,):
            store.set_device_target(FLEET, device, TARGET)
        identity = DeviceIdentityRecord(FLEET, first, board="NVIDIA Jetson Orin Nano 8GB Developer Kit", soc="tegra234",
                                        os="Ubuntu 22.04.4 LTS", l4t="36.4.0", jetpack="6.1", cuda="12.6", tensorrt="10.3.0",
                                        onnxruntime="1.20.1", power_mode="15W", clocks_locked=False, updated_at=now)  # fmt: skip
        store.upsert_status(DeviceStatus(FLEET, first, "online", BUNDLE.id, TARGET, "0.9.0", now, identity=identity))
        store.add_windows(windows)
        events = [DeviceEvent(FLEET, first, f"e{i}", kind, level, message, now - dt.timedelta(minutes=12 - i))
                  for i, (kind, level, message) in enumerate([
                      ("bundle_installed", "info", "installed digits-cnn-v1"), ("self_check_failed", "error", "golden outputs differ"),
                      ("thermal_throttle", "warning", "soc at 86 °C: clocks lowered"), ("bundle_installed", "info", "installed digits-cnn-v4")])]
        events += [DeviceEvent(FLEET, CAMERAS[1], "o1", "deploy_result", "info", "another camera's event", now - dt.timedelta(minutes=3))]
        store.add_events(events)
    devices = CAMERAS
    watching_waves = (
        {"index": 1, "spec": "1", "devices": [devices[0]], "state": "passed", "started_at": (now - dt.timedelta(seconds=100)).isoformat(),
         "finished_at": (now - dt.timedelta(seconds=40)).isoformat(), "seconds": 60.0, "reason": None,
         "health": {"devices": 1, "healthy": 1, "failed": 0, "error_rate": 0.0, "p99_before_ms": 11.8, "p99_after_ms": 12.1,
                    "p99_ratio": 1.03, "max_error_rate": 0.02, "max_p99_ratio": 1.5, "inferences": 240, "final": True}},
        {"index": 2, "spec": "50%", "devices": [devices[1]], "state": "watching", "started_at": (now - dt.timedelta(seconds=35)).isoformat(),
         "finished_at": None, "seconds": None, "reason": None, "watch_ends_at": (now + dt.timedelta(seconds=600)).isoformat(),
         "health": {"devices": 2, "healthy": 1, "failed": 0, "error_rate": 0.004, "p99_before_ms": 11.9, "p99_after_ms": 12.6,
                    "p99_ratio": 1.06, "max_error_rate": 0.02, "max_p99_ratio": 1.5, "inferences": 250, "final": False}},
        {"index": 3, "spec": "100%", "devices": [devices[2]], "state": "pending", "started_at": None, "finished_at": None,
         "seconds": None, "reason": None, "health": {}},
    )  # fmt: skip
    with open_rollout_log(url) as log:  # five rollouts in 15 minutes, three of them within a minute and a half
        for index, minutes in enumerate((14.0, 10.5, 10.0, 9.5, 5.0), start=1):
            log.save(_rollout(index, now - dt.timedelta(minutes=minutes), devices, "completed",
                              health={"error_rate": 0.0, "p99_before_ms": 12.0, "p99_after_ms": 11.7}))  # fmt: skip
        log.save(_rollout(6, now - dt.timedelta(seconds=100), devices, "watching", waves=watching_waves,
                          outcomes={devices[0]: "succeeded", devices[1]: "succeeded", devices[2]: "pending"},
                          options={"dropped_waves": [{"index": 3, "spec": "60%", "reason": "60% of 3 device(s) is 2, which earlier waves already reach"}]}))  # fmt: skip
    return url


def add_fresh_windows(url: str, seq: int) -> None:
    """One more window per device, starting just now, written early in a 10 s bucket (waits for that), so the page
    loaded right after sees the newest bucket still filling: its start is in the bucket ``until`` falls in."""
    import time

    while not 0.5 <= time.time() % 10 <= 4.0:
        time.sleep(0.1)
    start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=0.3)
    entries = [model_entry("detector", "yolo-int8-1", [9.0, 10.0]), model_entry("classifier", "mobilenet-2", [2.0])]
    windows = [_without_power(_parsed(model_telemetry(seq, entries, device=d, fleet=FLEET, start=start, power_mw=2000.0)))
               for d in CAMERAS]  # fmt: skip
    windows.append(_parsed(telemetry(seq, device=IDLE, fleet=FLEET, bundle=BUNDLE, latencies_ms=(), start=start)))
    with open_store(url) as store:
        store.add_windows(windows)
