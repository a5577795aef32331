"""Waves, target checks and the rollout record, before anything is sent."""

from __future__ import annotations

import datetime as dt

import pytest

from edgekit.fleet.rollout import RolloutPolicy, TargetMismatchError, check_targets, failure_hint, parse_waves
from edgekit.fleet.rollout_bundle import RolloutError
from edgekit.fleet.store.base import DeviceSummary

DEVICES = [f"d{i:02d}" for i in range(20)]


def _sizes(policy: RolloutPolicy, total: int) -> list[int]:
    return [len(devices) for _, devices in policy.plan(DEVICES[:total])]


def test_waves_are_cumulative_and_cover_every_device_once() -> None:
    policy = RolloutPolicy(waves=parse_waves("1, 10%,50%,100%"))
    plan = policy.plan(DEVICES)
    assert [spec for spec, _ in plan] == ["1", "10%", "50%", "100%"]
    assert [len(devices) for _, devices in plan] == [1, 1, 8, 10]  # 1, then up to 2, 10, 20
    assert [d for _, devices in plan for d in devices] == DEVICES  # in order, each once
    assert _sizes(policy, 5) == [1, 2, 2]  # 10% of 5 is 1 device: that wave adds none and is left out
    assert _sizes(RolloutPolicy(), 20) == [2, 18]  # no --waves: --canary 10%, then everyone
    assert _sizes(RolloutPolicy(canary="1"), 1) == [1]


@pytest.mark.parametrize(("text", "message"), [
    ("1,,100%", r"--waves '1,,100%' has an empty wave"),
    ("1,ten,100%", r"--waves 'ten' is neither a share like '10%' nor a device count"),
    ("0,100%", r"--waves '0' is neither a share"),
    ("1,150%", r"--waves '150%' is neither a share"),
])  # fmt: skip
def test_bad_wave_lists_are_explained(text: str, message: str) -> None:
    with pytest.raises(RolloutError, match=message):
        parse_waves(text)


def test_waves_must_grow_and_end_with_everyone() -> None:
    with pytest.raises(RolloutError, match=r"wave 2 \(10% = 2 device\(s\)\) is smaller than wave 1 \(50% = 10\)") as info:
        RolloutPolicy(waves=("50%", "10%", "100%")).plan(DEVICES)
    assert "1,10%,50%,100%" in info.value.hint
    with pytest.raises(RolloutError, match=r"the last wave reaches 10 of the 20 device\(s\)") as info:
        RolloutPolicy(waves=("1", "50%")).plan(DEVICES)
    assert "end the waves with 100%" in info.value.hint


def _device(name: str, target: str | None) -> DeviceSummary:
    return DeviceSummary("lab", name, "online", "demo-v1", target, None, None, None, None, None, None, 0, 0)


def test_devices_must_report_the_bundles_target_unless_forced() -> None:
    devices = [_device("pi", "raspberry-pi-5"), _device("box", "x86-64-cpu"), _device("new", None)]
    with pytest.raises(TargetMismatchError) as info:
        check_targets(devices, "x86-64-cpu", bundle="vision-1", force=False)
    message = str(info.value)
    assert "bundle vision-1 is built for target 'x86-64-cpu', but 2 of the 3 selected device(s) do not report it" in message
    assert "pi reports target 'raspberry-pi-5'; new reports no target; nothing was sent" in message
    assert "--target x86-64-cpu" in info.value.hint and "--force" in info.value.hint
    forced = check_targets(devices, "x86-64-cpu", bundle="vision-1", force=True)
    assert forced == {"pi": "reports target 'raspberry-pi-5'", "new": "reports no target"}
    assert check_targets(devices[1:2], "x86-64-cpu", bundle="vision-1", force=False) == {}
    with pytest.raises(TargetMismatchError, match="bundle vision-1 names no target"):
        check_targets(devices[1:2], None, bundle="vision-1", force=False)


def test_failure_hints_name_the_option_that_fixes_the_failure() -> None:
    refused = "deploy of file:///b.tar failed at download: deploy source refused: 'file:///b.tar' is not under ..."
    assert "--inbox DIR" in failure_hint("download", refused)
    assert "--allow-downgrade" in failure_hint("version", "bundle 'x' is version 1, older than version 2")
    assert "--allow-signature-change" in failure_hint("io_signature", "input 'image' float32[batch,1,8,8] -> ...")
    assert "--sign-commands" in failure_hint("unsigned", "command is not signed")
    assert failure_hint("switch", "rename failed") is None


def test_records_with_waves_round_trip_and_old_records_still_load(store_url: str) -> None:
    from edgekit.fleet.rollout_state import RolloutRecord, open_rollout_log

    now = dt.datetime.now(dt.timezone.utc)
    wave = {"index": 1, "spec": "1", "devices": ["d1"], "state": "passed", "started_at": now.isoformat(),
            "finished_at": now.isoformat(), "seconds": 0.0, "health": {"p99_ratio": 1.0}, "reason": None}  # fmt: skip
    record = RolloutRecord("r2", "lab", "b-2", "file:///b", "0" * 64, "deploying", ("d1",), ("d1", "d2"), now, now,
                           outcomes={"d1": "succeeded", "d2": "failed"}, waves=(wave,), target="x86-64-cpu",
                           device_results={"d2": {"wave": 2, "reason": "deploy of file:///b failed at version: older", "step": "version"}},
                           forced={"d2": "reports no target"})  # fmt: skip
    with open_rollout_log(store_url) as log:
        log.save(record.with_state("completed_with_failures"))
        old = {"rollout_id": "r1", "fleet": "lab", "bundle_id": "b-1", "url": "file:///a", "sha256": "1" * 64, "state": "completed",
               "canary": ["d1"], "devices": ["d1"], "started_at": (now - dt.timedelta(hours=2)).isoformat(),
               "updated_at": now.isoformat(), "reason": None, "previous_bundles": {}, "outcomes": {"d1": "succeeded"}, "health": {}}  # fmt: skip
        log.save(RolloutRecord.from_json(old))
        stored = log.recent()
        assert [r.rollout_id for r in log.recent(bundle_id="b-2")] == ["r2"]
        assert [r.rollout_id for r in log.recent(since=now - dt.timedelta(minutes=1))] == ["r2"]
        assert [r.rollout_id for r in log.recent(fleet="other")] == []
    assert [r.rollout_id for r in stored] == ["r2", "r1"]
    assert stored[0].waves == (wave,) and stored[0].forced == {"d2": "reports no target"} and stored[0].finished_at is not None
    assert stored[0].failed_devices() == {"d2": {"outcome": "failed", "wave": 2, "reason": "deploy of file:///b failed at version: older",
                                                 "step": "version"}}  # fmt: skip
    assert stored[1].waves == () and stored[1].finished_at is None and stored[0].to_json()["seconds"] >= 0


def test_the_store_keeps_rollouts_in_its_own_migrated_table(store_url: str) -> None:
    from edgekit.fleet.errors import StoreError
    from edgekit.fleet.store import open_store
    from edgekit.fleet.store.migrate import latest_version, migrations

    with open_store(store_url) as store:
        assert {m.version: m.name for m in migrations(store.dialect)}[4] == "rollouts"  # type: ignore[attr-defined]
        assert store.schema_version == latest_version(store.dialect)  # type: ignore[attr-defined]
        assert store.rollouts() == []
        with pytest.raises(StoreError, match="a rollout record needs fleet, state") as info:
            store.save_rollout({"rollout_id": "r9", "bundle_id": "b", "started_at": "2026-01-01T00:00:00+00:00",
                                "updated_at": "2026-01-01T00:00:00+00:00"})  # fmt: skip
        assert "RolloutRecord.to_json()" in info.value.hint
