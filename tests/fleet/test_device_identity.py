"""The collector records what each device says it is (status.v1 identity, target, power mode) on SQLite and
PostgreSQL, and `edgekit fleet report` groups by target and power mode. Statuses come from the runtime's own
readers on the board fixture trees (tests/runtime/sensors/fixtures/identity)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from edgekit_runtime.agent.telemetry import build_status, encode_message
from edgekit_runtime.sensors.target_detect import inspect_device

from edgekit.fleet.ingest import parse_message
from edgekit.fleet.report import build_report
from edgekit.fleet.store import FleetStore, open_store
from edgekit.fleet.store.base import DeviceStatus
from tests.fleet.messages import T0, telemetry

IDENTITY = Path(__file__).resolve().parents[1] / "runtime" / "sensors" / "fixtures" / "identity"


def board_status(device: str, tree: str, *, at: dt.datetime = T0, root: Path | None = None,
                 state: str = "online") -> dict[str, Any]:  # fmt: skip
    report = inspect_device(root or IDENTITY / tree)
    return build_status(device=device, fleet="lab", state=state, at=at, identity=report.identity.to_dict(),  # type: ignore[arg-type]
                        target=report.detection.to_status(), power_mode=report.power_mode.to_dict())  # fmt: skip


def ingest(store: FleetStore, message: dict[str, Any], received: dt.datetime) -> DeviceStatus:
    record = parse_message(f"edgekit/v1/lab/{message['device']}/{'status' if 'state' in message else 'telemetry'}",
                           encode_message(message), received_at=received)  # fmt: skip
    if isinstance(record, DeviceStatus):
        store.upsert_status(record)
    else:
        store.add_windows([record])  # type: ignore[list-item]
    return record  # type: ignore[return-value]


def test_status_identity_is_parsed_and_old_statuses_still_are() -> None:
    record = parse_message("edgekit/v1/lab/nano-1/status", encode_message(board_status("nano-1", "jetson_orin_nano_super_jp62")),
                           received_at=T0)  # fmt: skip
    assert isinstance(record, DeviceStatus)
    assert record.target == "jetson-orin-nano-super"
    identity = record.identity
    assert identity is not None
    assert (identity.board, identity.soc, identity.l4t, identity.jetpack, identity.cuda, identity.tensorrt) == (
        "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super", "nvidia,tegra234", "36.4.3", "6.2",
        "12.6.68", "10.3.0")
    assert (identity.power_mode, identity.clocks_locked) == ("MAXN_SUPER+clocks", True)
    # An agent from before issue 19 sends none of the new fields: no target, no identity row, still accepted.
    old = parse_message("edgekit/v1/lab/old-1/status",
                        encode_message(build_status(device="old-1", fleet="lab", state="online", at=T0)), received_at=T0)  # fmt: skip
    assert isinstance(old, DeviceStatus) and old.target is None and old.identity is None
    # The identity must validate: a status with an unknown identity field is rejected, naming it.
    bad = board_status("nano-1", "jetson_orin_nano_jp61")
    bad["identity"]["serial"] = "123"
    rejection = parse_message("edgekit/v1/lab/nano-1/status", json.dumps(bad).encode(), received_at=T0)
    assert rejection.reason == "schema_mismatch" and "serial" in rejection.detail  # type: ignore[union-attr]


def test_store_keeps_the_latest_identity_and_the_report_groups_by_target_and_power_mode(
        store: FleetStore, tmp_path: Path) -> None:  # fmt: skip
    import shutil

    later = T0 + dt.timedelta(minutes=5)
    ingest(store, board_status("nano-1", "jetson_orin_nano_jp61"), T0)
    ingest(store, board_status("nano-2", "jetson_orin_nano_jp61"), T0)
    ingest(store, board_status("super-1", "jetson_orin_nano_super_jp62"), T0)
    ingest(store, build_status(device="old-1", fleet="lab", state="online", at=T0), T0)
    # nano-2 is switched to 15W (nvpmodel -m 0): its agent republishes the status.
    root = tmp_path / "nano-2"
    shutil.copytree(IDENTITY / "jetson_orin_nano_jp61", root, symlinks=True)
    (root / "var/lib/nvpmodel/status").write_text("pmode:0000 fmode:quiet\n")
    ingest(store, board_status("nano-2", "jetson_orin_nano_jp61", root=root, at=later), later)
    # A status that arrives late (older than the stored one) does not undo the newer power mode.
    ingest(store, board_status("nano-2", "jetson_orin_nano_jp61", at=T0), T0)

    identities = {(i.device, i.power_mode, i.jetpack, i.l4t) for i in store.device_identities("lab")}
    assert identities == {("nano-1", "7W", "6.1", "36.4.0"), ("nano-2", "15W", "6.1", "36.4.0"),
                          ("super-1", "MAXN_SUPER+clocks", "6.2", "36.4.3")}  # fmt: skip
    assert store.device_identities("other") == []
    super_row = next(i for i in store.device_identities() if i.device == "super-1")
    assert super_row.payload["identity"]["cpu"]["model"] == "Cortex-A78AE"
    assert super_row.clocks_locked is True
    targets = {s.device: s.target for s in store.device_summaries("lab")}
    assert targets == {"nano-1": "jetson-orin-nano-8gb", "nano-2": "jetson-orin-nano-8gb",
                       "super-1": "jetson-orin-nano-super", "old-1": None}  # fmt: skip

    latencies = {"nano-1": (10.0,) * 5, "nano-2": (6.0,) * 5, "super-1": (4.0,) * 5, "old-1": (20.0,) * 5}
    for device, values in latencies.items():
        for seq in (1, 2):
            ingest(store, telemetry(seq, device=device, latencies_ms=values), T0)
    # Windows that say the mode they were measured in count under it, whatever the device's mode now.
    for seq, latency_ms, mode in ((3, 10.0, "7W"), (4, 6.0, "15W")):
        message = telemetry(seq, device="nano-2", latencies_ms=(latency_ms,) * 5)
        message["power_mode"] = mode
        ingest(store, message, T0)
    report = build_report(store, fleet="lab", since=T0 - dt.timedelta(hours=1), until=T0 + dt.timedelta(hours=1))
    groups = {(g.target, g.power_mode): (g.devices, g.windows, g.p50_ms) for g in report.groups}
    assert groups == {
        ("jetson-orin-nano-8gb", "7W"): (2, 3, pytest.approx(10.0)),  # nano-1's two and nano-2's window in 7W
        ("jetson-orin-nano-8gb", "15W"): (1, 3, pytest.approx(6.0)),
        ("jetson-orin-nano-super", "MAXN_SUPER+clocks"): (1, 2, pytest.approx(4.0)),
        (None, None): (1, 2, pytest.approx(20.0)),
    }
    assert {row["power_mode"] for row in report.to_json()["groups"]} == {"7W", "15W", "MAXN_SUPER+clocks", None}
    # Grouping by power mode alone, as the store API offers it; other groupings are unchanged.
    by_mode = {a.power_mode: (a.devices, a.windows) for a in store.aggregate(("power_mode",), fleet="lab")}
    assert by_mode == {"7W": (2, 3), "15W": (1, 3), "MAXN_SUPER+clocks": (1, 2), None: (1, 2)}
    assert {a.target: a.windows for a in store.aggregate(("target",), fleet="lab")} == {
        "jetson-orin-nano-8gb": 6, "jetson-orin-nano-super": 2, None: 2}
    # Rolled up, nothing moves: the fleet aggregates keep the mode each window was measured in.
    store.apply_retention(dt.timedelta(seconds=0), now=T0 + dt.timedelta(days=1))
    rolled = {a.power_mode: (a.devices, a.windows) for a in store.aggregate(("power_mode",), fleet="lab")}
    assert rolled == by_mode


def test_migration_5_on_a_version_4_database(tmp_path: Path) -> None:
    """A store created by the previous edgekit (version 4) gains the table on open and keeps its statuses."""
    import sqlite3

    from edgekit.fleet.store.migrate import migrations

    path = tmp_path / "old.db"
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)")
    for migration in migrations("sqlite")[:4]:
        connection.executescript(migration.sql)
        connection.execute("INSERT INTO schema_version VALUES (?, ?, ?)", (migration.version, migration.name, "2026-01-01"))
    connection.execute("INSERT INTO device_status VALUES ('lab', 'old-1', 'online', NULL, '0.1.0', 1.0, '{}')")
    connection.commit()
    connection.close()
    with open_store(f"sqlite:///{path}") as store:
        assert store.schema_version == len(migrations("sqlite")) >= 5
        assert [s.device for s in store.device_summaries()] == ["old-1"]
        ingest(store, board_status("pi-1", "raspberry_pi_5"), T0)
        (pi,) = store.device_identities()
        assert (pi.board, pi.power_mode, pi.clocks_locked) == ("Raspberry Pi 5 Model B Rev 1.0", None, False)


def test_fleet_report_cli_shows_the_power_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import csv
    import io

    from edgekit.cli.main import main

    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    with open_store(url) as store:
        ingest(store, board_status("super-1", "jetson_orin_nano_super_jp62", at=now), now)
        ingest(store, telemetry(1, device="super-1", start=now - dt.timedelta(minutes=5)), now)
    assert main(["fleet", "report", "--store", url, "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["target"], r["power_mode"], r["devices"]) for r in rows] == [("jetson-orin-nano-super", "MAXN_SUPER+clocks", "1")]
    assert main(["fleet", "report", "--store", url]) == 0
    text = capsys.readouterr().out
    assert "power mode" in text and "MAXN_SUPER+clocks" in text
