"""``edgekit fleet`` options that would end in a traceback (a port beyond 65535, an infinite window, an empty
--targets) or silently in something else (--rollup-minutes 0) are refused before anything starts, by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit.cli.main import main as edgekit_main

BROKER = ["--broker", "mqtt://127.0.0.1:1"]  # nothing listens there: nothing may get as far as connecting


@pytest.mark.parametrize(("command", "message"), [
    (["collect", *BROKER, "--metrics-port", "70000"],
     "edgekit fleet collect: error: argument --metrics-port: port 70000 is out of range: give a whole number from 0 to "
     "65535 (0 picks a free one)"),
    (["up", "--broker-port", "70000"], "edgekit fleet up: error: argument --broker-port: port 70000 is out of range"),
    (["up", "--port", "-1"], "edgekit fleet up: error: argument --port: port -1 is out of range"),
    (["dashboard", "--port", "70000"], "edgekit fleet dashboard: error: argument --port: port 70000 is out of range"),
    (["dashboard", "--port", "http"], "edgekit fleet dashboard: error: argument --port: 'http' is not a port number"),
    (["simulate", "--history", "1h", "--window-s", "inf"],
     "edgekit fleet simulate: error: argument --window-s: 'inf' is not a finite number"),
    (["simulate", "--history", "1h", "--targets", ","],
     "edgekit fleet simulate: error: argument --targets: ',' names nothing: give one or more names separated by commas"),
    (["collect", *BROKER, "--retention-hours", "nan"],
     "edgekit fleet collect: error: argument --retention-hours: 'nan' is not a finite number"),
    (["collect", *BROKER, "--rollup-retention-days", "inf"],
     "edgekit fleet collect: error: argument --rollup-retention-days: 'inf' is not a finite number"),
    (["up", "--simulate", "-3", "--port", "0", "--broker-port", "0", "--duration", "0.1"],
     "edgekit fleet up: error: argument --simulate: -3 is out of range: give a whole number of devices from 0 to 100,000, "
     "e.g. --simulate 20"),
    (["up", "--simulate", "lots"], "edgekit fleet up: error: argument --simulate: 'lots' is not a number of devices"),
    (["simulate", *BROKER, "--duration", "-1"],
     "edgekit fleet simulate: error: argument --duration: '-1' is not above 0: give a number of seconds above 0"),
    (["simulate", *BROKER, "--deploy-watch-s", "-1"],
     "edgekit fleet simulate: error: argument --deploy-watch-s: '-1' is not above 0: give a number of seconds above 0"),
    (["simulate", *BROKER, "--deploy-watch-s", "nan"],
     "edgekit fleet simulate: error: argument --deploy-watch-s: 'nan' is not a finite number"),
])  # fmt: skip
def test_bad_values_are_refused_when_parsed(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str],
                                            message: str) -> None:  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        edgekit_main(["fleet", *command, "--store", f"sqlite:///{tmp_path / 'fleet.db'}"])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "fleet.db").exists()


@pytest.mark.parametrize(("options", "message"), [
    (["--rollup-minutes", "0"], "error: --rollup-minutes must be a whole number of minutes >= 1, got 0\n"
                                "  hint: the size of the buckets raw windows are rolled up into; the default is 5"),
    (["--rollup-minutes", "-5"], "error: --rollup-minutes must be a whole number of minutes >= 1, got -5"),
    (["--metrics-port", "65535", "--workers", "2"],
     "error: --metrics-port 65535 with --workers 2 needs ports up to 65536, beyond 65535\n"
     "  hint: give a lower --metrics-port (worker i serves /metrics on P+i), or 0"),
])  # fmt: skip
def test_collect_refuses_bad_values_before_starting(tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str],
                                                   message: str) -> None:  # fmt: skip
    store = tmp_path / "fleet.db"
    assert edgekit_main(["fleet", "collect", *BROKER, "--store", f"sqlite:///{store}", *options]) == 2
    assert message in capsys.readouterr().err
    assert not store.exists()
