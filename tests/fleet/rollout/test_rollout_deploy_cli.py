"""``edgekit fleet deploy`` refusing what would break a rollout before anything is sent (gate options that are not
finite or out of range, a command no device would take), and recording a deploy ended by SIGTERM as ``stopped``.
A real Mosquitto and SQLite store; the devices are known to the store but run no agent, so nothing answers."""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgekit.bundle.pack import pack_bundle
from edgekit.cli.main import main
from edgekit.fleet.rollout_answers import refuse_a_second_rollout
from edgekit.fleet.rollout_state import StoreRolloutLog
from edgekit.fleet.store import open_store
from edgekit.fleet.store.base import DeviceStatus

REPO = Path(__file__).resolve().parents[3]
DEVICES = "d0,d1,d2"


def _store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    with open_store(url) as store:
        store.upsert_statuses([DeviceStatus("lab", d, "online", "old-1", "x86-64-cpu", "sim-1", dt.datetime.now(dt.timezone.utc))
                               for d in DEVICES.split(",")])  # fmt: skip
    return url


def _deploy(bundle: Path, broker: str, store_url: str, key: Path, *extra: str) -> list[str]:
    return ["fleet", "deploy", str(bundle), "--broker", broker, "--store", store_url, "--key", str(key), "--devices", DEVICES,
            "--waves", "1,100%", *extra]  # fmt: skip


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--max-error-rate", "nan", "argument --max-error-rate: 'nan' is not a finite number: give a share from 0 to 1, e.g. 0.02 for 2 %"),
    ("--max-error-rate", "2", "argument --max-error-rate: '2' is not from 0 to 1: give a share from 0 to 1, e.g. 0.02 for 2 %"),
    ("--max-p99-ratio", "nan", "argument --max-p99-ratio: 'nan' is not a finite number: give a ratio above 0, e.g. 1.5 (may grow by half)"),
    ("--max-p99-ratio", "-1", "argument --max-p99-ratio: '-1' is not above 0: give a ratio above 0, e.g. 1.5 (may grow by half)"),
    ("--health-window-s", "inf", "argument --health-window-s: 'inf' is not a finite number: give a number of seconds above 0, e.g. 60"),
    ("--health-window-s", "nan", "argument --health-window-s: 'nan' is not a finite number: give a number of seconds above 0, e.g. 60"),
    ("--deploy-timeout-s", "-5", "argument --deploy-timeout-s: '-5' is not above 0: give a number of seconds above 0, e.g. 60"),
    ("--deploy-timeout-s", "0", "argument --deploy-timeout-s: '0' is not above 0: give a number of seconds above 0, e.g. 60"),
])  # fmt: skip
def test_gate_options_that_are_not_finite_or_out_of_range_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                      option: str, value: str, message: str) -> None:  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        main(_deploy(tmp_path / "bundle", "mqtt://127.0.0.1:1", _store(tmp_path), tmp_path / "key.pem", f"{option}={value}"))
    # before: --max-error-rate nan let a wave with 50 % errors pass, --health-window-s nan/inf crashed after the canary
    assert exited.value.code == 2
    assert f"edgekit fleet deploy: error: {message}" in capsys.readouterr().err


def test_a_url_base_no_device_would_take_is_refused_before_any_record(mosquitto, signed_bundle, fleet_keys, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    store_url = _store(tmp_path)
    bundle = pack_bundle(signed_bundle("vision-ftp"), tmp_path / "vision-ftp.tar")

    code = main(_deploy(bundle, mosquitto.url, store_url, fleet_keys[1], "--url-base", "ftp://files.example/bundles"))

    # before: the record was saved, then the first command failed its schema: exit 1, "stopped after commands went out"
    assert code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert ("error: --url-base: devices would refuse the deploy command: args.url: 'ftp://files.example/bundles/vision-ftp.tar' "
            "does not match the pattern '^(https?|file)://'; nothing was sent") in err
    assert "hint: devices download over https://, http:// or file://: give --url-base https://HOST/PATH, or --inbox DIR" in err
    assert "stopped after commands went out" not in err
    with open_store(store_url) as store:
        assert StoreRolloutLog(store).recent(5) == []


def test_sigterm_records_the_rollout_stopped(mosquitto, signed_bundle, fleet_keys, tmp_path: Path) -> None:
    store_url = _store(tmp_path)
    bundle = signed_bundle("vision-term")
    deploy = subprocess.Popen([sys.executable, "-m", "edgekit.cli.main",
                               *_deploy(bundle, mosquitto.url, store_url, fleet_keys[1], "--deploy-timeout-s", "60")],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        seen = ""
        while "deploying wave 1/2" not in seen:  # the canary's command is out; nothing answers it
            line = deploy.stderr.readline()
            assert line, f"fleet deploy ended before its first wave: {seen}"
            seen += line
        time.sleep(0.5)
        deploy.send_signal(signal.SIGTERM)  # systemd stop, `timeout`, a cancelled CI job
        _, rest = deploy.communicate(timeout=30)
    finally:
        if deploy.poll() is None:
            deploy.kill()

    # before: killed by the signal (-15) with the record left "deploying", refusing the next deploy for 4 minutes
    assert deploy.returncode == 128 + signal.SIGTERM, seen + rest
    with open_store(store_url) as store:
        log = StoreRolloutLog(store)
        (record,) = log.recent(5)
        assert record.state == "stopped" and record.outcomes == {"d0": "deploying", "d1": "not_started", "d2": "not_started"}
        assert record.reason == ("the deploy was ended by SIGTERM during wave 1 (1, deploying); no rollback was sent: 0 "
                                 "device(s) that took the bundle keep it; 1 device(s) were sent the bundle and had not "
                                 "answered: they may still take it (`edgekit fleet status` shows the bundle each runs)")  # fmt: skip
        refuse_a_second_rollout(log, "lab")  # the next deploy of the fleet may start
    assert (f"terminated (SIGTERM): rollout {record.rollout_id} is recorded stopped; no rollback was sent; "
            "`edgekit fleet report --fleet lab` shows which devices took the bundle") in " ".join(rest.split())
