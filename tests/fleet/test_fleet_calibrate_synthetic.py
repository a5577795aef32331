"""``edgekit fleet calibrate`` on a store whose devices are simulated (the ground-truth fleet of
:mod:`edgekit.estimate.ground_truth`, seeded by ``seed_history``): refused unless ``--allow-synthetic``, and then
every entry written says SYNTHETIC, as do the estimates that read it; a store of real agents calibrates as before."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from edgekit.cli.main import main
from edgekit.estimate import estimate
from edgekit.estimate.fleet_fit import find_bundles
from edgekit.estimate.ground_truth import seed_ground_truth
from edgekit.fleet.store import open_store
from edgekit.fleet.store.base import DeviceStatus
from edgekit.target import get_target
from tests.estimate.graphs import conv_net
from tests.estimate.test_fleet_calibrate import TRUTH, write_bundles

TARGET = "jetson-orin-nano-8gb"


@pytest.fixture()
def simulated_fleet(tmp_path: Path) -> tuple[str, Path]:
    bundles_dir = write_bundles(tmp_path / "bundles")
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    with open_store(url) as store:
        seed_ground_truth(store, get_target(TARGET), find_bundles([bundles_dir]), TRUTH, devices=2, hours=0.5)
    return url, bundles_dir


def _calibrate(url: str, bundles_dir: Path, out: Path, *extra: str) -> int:
    return main(["fleet", "calibrate", "--store", url, "--bundles", str(bundles_dir), "--out", str(out), *extra])


def test_calibrate_refuses_a_store_of_simulated_devices(simulated_fleet: tuple[str, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    url, bundles_dir = simulated_fleet
    out = tmp_path / "calibration.json"
    assert _calibrate(url, bundles_dir, out) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"error: {url} has 12 simulated device(s) (`edgekit fleet simulate`): their latency is SYNTHETIC" in err
    assert "pass --allow-synthetic to fit to simulated numbers anyway" in err
    assert not out.exists()  # later estimates read nothing made up


def test_calibrate_with_allow_synthetic_marks_every_entry(simulated_fleet: tuple[str, Path], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    url, bundles_dir = simulated_fleet
    out = tmp_path / "calibration.json"
    assert _calibrate(url, bundles_dir, out, "--allow-synthetic", "--json") == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out.strip().splitlines()[-1])
    assert report["synthetic"] is True and report["simulated_devices"] == 12
    assert all(t["source"].startswith("SYNTHETIC: fitted to a store with 12 simulated devices") for t in report["targets"])
    err = " ".join(captured.err.split())
    assert "; 12 simulated devices: SYNTHETIC" in err and "the factors are SYNTHETIC" in err
    (entry,) = json.loads(out.read_text())["entries"]
    assert entry["target"] == TARGET and entry["source"].startswith("SYNTHETIC: fitted to a store with 12 simulated devices")
    found = estimate(conv_net(96, 40), get_target(TARGET), dims={"batch": 8}, calibration=out)
    assert found.calibration["calibrated"] and any("efficiency factors (SYNTHETIC:" in line for line in found.factors)


def test_calibrate_a_store_of_real_agents_needs_no_flag(simulated_fleet: tuple[str, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    url, bundles_dir = simulated_fleet
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1)
    with open_store(url) as store:  # the same devices, now last heard from as real agents
        store.upsert_statuses([DeviceStatus(s.fleet, s.device, "online", s.bundle_id, s.target, "0.1.0", later)
                               for s in store.device_summaries()])  # fmt: skip
        assert store.simulated_devices() == 0
    out = tmp_path / "calibration.json"
    assert _calibrate(url, bundles_dir, out) == 0
    assert "SYNTHETIC" not in capsys.readouterr().err
    (entry,) = json.loads(out.read_text())["entries"]
    assert entry["source"].startswith("fitted to 6 fleet observation(s)")
